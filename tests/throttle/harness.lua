-- Drives plugins/job_submit.lua under plain lua5.1 with a fake `slurm` table (tests/throttle).
-- Globals set before this file runs: PLUGIN (path), NOW (fake clock, Unix seconds).
-- The test's own Lua code follows this file and prints what it checks.
local real_time = os.time
os.time = function(t)
    if t then return real_time(t) end
    return NOW
end

LOGS, USER_MSGS = {}, {}
slurm = {
    SUCCESS = 0, ERROR = -1, NICE_OFFSET = 2147483648,
    -- like Slurm's: these format their arguments
    log_info = function(fmt, ...) LOGS[#LOGS + 1] = "info: " .. string.format(fmt, ...) end,
    log_error = function(fmt, ...) LOGS[#LOGS + 1] = "error: " .. string.format(fmt, ...) end,
    log_user = function(fmt, ...) USER_MSGS[#USER_MSGS + 1] = string.format(fmt, ...) end,
}

NO_VAL, NO_VAL16 = 4294967294, 65534

-- A job descriptor as the 22.05 plugin shows it: unset numbers are NO_VAL, unset strings nil.
function job(fields)
    local j = { user_id = 1000, user_name = "alice", nice = NO_VAL, num_tasks = NO_VAL,
                sockets_per_node = NO_VAL16, min_nodes = NO_VAL }
    for k, v in pairs(fields or {}) do j[k] = v end
    return j
end

function out(...)
    local parts = {}
    for i = 1, select("#", ...) do parts[#parts + 1] = tostring(select(i, ...)) end
    print(table.concat(parts, "|"))
end

function dump_logs()
    for _, l in ipairs(LOGS) do print("LOG " .. l) end
    for _, m in ipairs(USER_MSGS) do print("USER " .. m) end
    LOGS, USER_MSGS = {}, {}
end

local rc = dofile(PLUGIN)
assert(rc == 0, "the plugin's chunk must return slurm.SUCCESS")
G = gpuslurm_throttle
