-- Drives plugins/job_submit.lua under plain lua5.1 with a fake `slurm` table (tests/slurm/test_plugin_*.py).
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
-- An sbatch job by default (a script and an environment); interactive{} is srun's or salloc's.
function job(fields)
    local j = { user_id = 1000, user_name = "alice", nice = NO_VAL, num_tasks = NO_VAL,
                sockets_per_node = NO_VAL16, min_nodes = NO_VAL, max_nodes = NO_VAL,
                script = "#!/bin/sh\ntrue\n", environment = { HOME = "/home/alice" } }
    for k, v in pairs(fields or {}) do j[k] = v end
    return j
end

function interactive(fields)
    local j = job(fields)
    j.script, j.environment = nil, nil
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

-- What slurmctld hands slurm_job_modify (22.05 and later). The record: user_id set, user_name nil
-- (slurmctld never fills it), numbers as Slurm keeps them (nice with NICE_OFFSET), no task count.
-- The update: only the fields `scontrol update` sets, the rest NO_VAL/NO_VAL16/nil; user_id is
-- the owner's (slurmctld sets it before calling the plugin) and user_name resolves it through the
-- user database, as Slurm's uid_to_string_or_null does.
PASSWD = { [0] = "root", [1000] = "alice", [1001] = "bob" }

function record(fields)
    local r = { job_id = 42, user_id = 1000, min_nodes = 1, max_nodes = 0,
                nice = slurm.NICE_OFFSET }
    for k, v in pairs(fields or {}) do r[k] = v end
    return r
end

local UPDATE_NUMBERS = { "min_nodes", "max_nodes", "num_tasks", "min_cpus", "max_cpus", "nice" }
local UPDATE_NUMBERS16 = { "ntasks_per_node", "ntasks_per_socket", "sockets_per_node", "cores_per_socket",
                           "threads_per_core", "pn_min_cpus", "cpus_per_task", "ntasks_per_tres" }
local UPDATE_ZEROS = { "ntasks_per_board", "sockets_per_board", "boards_per_node" }  -- 0 when unset (22.05)

function update(fields, owner)
    local u = { user_id = owner or 1000 }
    for _, k in ipairs(UPDATE_NUMBERS) do u[k] = NO_VAL end
    for _, k in ipairs(UPDATE_NUMBERS16) do u[k] = NO_VAL16 end
    for _, k in ipairs(UPDATE_ZEROS) do u[k] = 0 end
    for k, v in pairs(fields or {}) do u[k] = v end
    return setmetatable(u, { __index = function(t, k)
        if k == "user_name" then return PASSWD[rawget(t, "user_id")] end
        return nil
    end })
end
