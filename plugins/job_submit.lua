--[[
gpuslurm job_submit.lua: throttle the GPU submissions of users listed in gpuslurm's throttle file.

Install it as job_submit.lua in the directory of slurm.conf, set JobSubmitPlugins=lua and run
`scontrol reconfigure`. Written for Lua 5.1 (Debian's Slurm 22.05 links liblua5.1).

The throttle file is written by `gpuslurm throttle add|remove|sync` (format in
src/gpuslurm/slurm/throttle.py): one line per user, seven tab-separated fields
    user  until  mode  value  created  contact  reason
For a throttled user whose line has not expired, a job that asks for GPUs (--gres=gpu..,
--gpus, --gpus-per-node, --gpus-per-task, --gpus-per-socket, or mps/shard gres) is
    reject:   refused, with a message saying why, until when and whom to ask;
    cap:      given at most `value` GPUs (see cap_request below);
    priority: given `value` more nice (a lower priority).
Jobs without GPUs pass. The file is read at most every RELOAD_SECONDS; a missing, unreadable or
broken file, or any error in this script's own logic, lets every job through (fail open) and is
logged to slurmctld's log: a throttle must never become an outage.
--]]

local RELOAD_SECONDS = 3
-- nil: the file "gpuslurm-throttle" beside this script, i.e. in slurm.conf's directory.
local THROTTLE_FILE = nil
local DEFAULT_CONTACT = "your cluster administrators"
local THROTTLE_NON_GPU = false   -- true: reject mode refuses every job of the user, GPU or not
local GPU_GRES = { gpu = true, mps = true, shard = true }  -- gres names that mean "uses a GPU"
local TRES_FIELDS = { "tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task" }

local NO_VAL = 4294967294     -- Slurm's NO_VAL: the field was not set
local NO_VAL16 = 65534
local HEADER_PREFIX = "# gpuslurm-throttle v1 id="
local MODES = { reject = true, cap = true, priority = true }

local M = {}  -- the plugin's internals, exposed as gpuslurm_throttle for tests

local function log_info(fmt, ...) slurm.log_info("gpuslurm: " .. fmt, ...) end
local function log_error(fmt, ...) slurm.log_error("gpuslurm: " .. fmt, ...) end

function M.default_path()
    if THROTTLE_FILE then return THROTTLE_FILE end
    local source = debug.getinfo(1, "S").source or ""
    local dir = source:match("^@(.*)/[^/]*$")
    return (dir or "/etc/slurm") .. "/gpuslurm-throttle"
end

-- ---------------------------------------------------------------------------------------------
-- The throttle file

-- One line to a throttle, or nil for junk. The same rules as gpuslurm.slurm.throttle._parse_line.
function M.parse_line(line)
    local user, until_s, mode, value, created, contact, reason = line:match(
        "^([^\t%s#][^\t%s]*)\t(%d+)\t(%l+)\t(%d+)\t(%d+)\t([^\t]*)\t([^\t]*)$")
    if not user or not MODES[mode] then return nil end
    value = tonumber(value)
    if mode ~= "reject" and value < 1 then return nil end
    return { user = user, ["until"] = tonumber(until_s), mode = mode, value = value,
             contact = contact, reason = reason }
end

-- Read the file into a table user -> throttle. Returns users, junk count, first junk line number;
-- users is nil when the file cannot be opened (the second value then says why).
function M.read_file(path, now)
    local fh, err = io.open(path, "r")
    if not fh then return nil, err end
    local users, junk, first_junk, number = {}, 0, nil, 0
    local header = nil
    for raw in fh:lines() do
        number = number + 1
        local line = raw:gsub("\r$", "")
        if number == 1 then header = line end
        if line:find("^%s*$") or line:sub(1, 1) == "#" then
            -- comment or blank
        else
            local t = M.parse_line(line)
            if t == nil then
                junk = junk + 1
                first_junk = first_junk or number
            elseif t["until"] > now then
                users[t.user] = t   -- the last unexpired line of a user wins
            end
        end
    end
    fh:close()
    return users, junk, first_junk, header
end

local cache = { checked = nil, header = nil, users = {}, count = 0, state = nil, names = {} }
M.cache = cache

local function first_line(path)
    local fh = io.open(path, "r")
    if not fh then return nil end
    local line = fh:read("*l")
    fh:close()
    return line
end

-- The current throttles, re-read at most every RELOAD_SECONDS; a file whose header (which carries
-- gpuslurm's write id) did not change is not parsed again.
function M.throttles(now)
    if cache.checked and now >= cache.checked and now - cache.checked < RELOAD_SECONDS then
        return cache.users, cache.count
    end
    cache.checked = now
    local path = M.path or M.default_path()
    local header = first_line(path)
    if header and cache.header == header and header:sub(1, #HEADER_PREFIX) == HEADER_PREFIX then
        return cache.users, cache.count
    end
    local users, junk, first_junk, read_header = M.read_file(path, now)
    if users == nil then
        if cache.state ~= "missing" then
            log_info("throttle file %s not readable (%s): no user is throttled", path, tostring(junk))
        end
        cache.state, cache.users, cache.count, cache.header = "missing", {}, 0, nil
        return cache.users, 0
    end
    local count = 0
    for _ in pairs(users) do count = count + 1 end
    if junk > 0 then
        log_error("throttle file %s: skipped %d junk line(s), the first at line %d", path, junk, first_junk)
    end
    if cache.state ~= "ok" or count ~= cache.count then
        log_info("throttle file %s: %d user(s) throttled", path, count)
    end
    cache.state, cache.users, cache.count, cache.header = "ok", users, count, read_header
    cache.names = {}  -- uid -> name cache: refreshed with the file
    return users, count
end

-- ---------------------------------------------------------------------------------------------
-- GPU requests in the job descriptor

local SUFFIX = { [""] = 1, k = 1024, m = 1024 * 1024, g = 1024 * 1024 * 1024 }

-- One tres item ("gres:gpu:2", "gres/gpu:h100:2", "gpu", "gres/gpu=4", "gres:mps:50") to
-- {name=, type=, count=, prefix=, sep=}; nil for items that are not gres (cpu=4, license...).
function M.parse_item(item)
    local prefix, rest = item:match("^(gres[:/])(.*)$")
    if not prefix then prefix, rest = "", item end
    local name, tail = rest:match("^([%w_%-]+)(.*)$")
    if not name then return nil end
    local r = { name = name, prefix = prefix, sep = ":", count = 1 }
    if tail == "" then return r end
    -- [":" type] (":" | "=") count[suffix]  or  ":" type
    local typ, sep, num, suf = tail:match("^:([^:=]+)([:=])(%d+)(%a?)$")
    if not typ then
        sep, num, suf = tail:match("^([:=])(%d+)(%a?)$")
    end
    if num then
        local mult = SUFFIX[suf:lower()]
        if not mult then return nil end
        r.type, r.sep, r.count = typ, sep, tonumber(num) * mult
        return r
    end
    typ = tail:match("^:([^:=,]+)$")
    if typ then r.type = typ; return r end
    return nil
end

function M.format_item(r)
    local s = r.prefix .. r.name
    if r.type then s = s .. ":" .. r.type end
    return s .. r.sep .. string.format("%d", r.count)
end

local function split(text)
    local items = {}
    for item in tostring(text):gmatch("[^,]+") do items[#items + 1] = item end
    return items
end

-- Does any tres_per_* field ask for a GPU (or a GPU share)? Returns true and the first field.
function M.gpu_request(job_desc)
    for _, field in ipairs(TRES_FIELDS) do
        local value = job_desc[field]
        if value ~= nil and value ~= "" then
            for _, item in ipairs(split(value)) do
                local r = M.parse_item(item)
                if r and GPU_GRES[r.name] and r.count > 0 then return true, field end
            end
        end
    end
    return false
end

local function known(n)
    return n ~= nil and n ~= NO_VAL and n ~= NO_VAL16 and n > 0 and n < NO_VAL16
end

-- Limit every gpu count in the request so the job gets at most `cap` GPUs per node (per-node
-- and per-socket forms) or in all (--gpus); per-task counts are cut to floor(cap / tasks).
-- Returns a table field -> new value (only changed fields), or nil and a reason when the
-- request cannot be capped (a per-task request whose tasks alone exceed the cap).
function M.cap_request(job_desc, cap)
    local changes = {}
    for _, field in ipairs(TRES_FIELDS) do
        local value = job_desc[field]
        if value ~= nil and value ~= "" then
            local limit = cap
            if field == "tres_per_task" and known(job_desc.num_tasks) then
                limit = math.floor(cap / job_desc.num_tasks)
            elseif field == "tres_per_socket" and known(job_desc.sockets_per_node) then
                limit = math.floor(cap / job_desc.sockets_per_node)
            end
            local items, changed = split(value), false
            for i, item in ipairs(items) do
                local r = M.parse_item(item)
                if r and r.name == "gpu" and r.count > limit then
                    if limit < 1 then
                        return nil, string.format("%d tasks with GPUs exceed the cap of %d GPU(s)",
                                                  job_desc.num_tasks, cap)
                    end
                    r.count = limit
                    items[i] = M.format_item(r)
                    changed = true
                end
            end
            if changed then changes[field] = table.concat(items, ",") end
        end
    end
    return changes
end

-- ---------------------------------------------------------------------------------------------
-- Decisions

local function when(t)
    return os.date("%Y-%m-%d %H:%M %Z", t["until"])
end

local function contact_of(t)
    if t.contact ~= "" then return t.contact end
    return DEFAULT_CONTACT
end

local function because(t)
    if t.reason ~= "" then return " because of " .. t.reason end
    return ""
end

-- What to do with this job of a throttled user: returns the action ("pass", "reject", "cap",
-- "nice"), the message for the user, and the changes (field -> value) to make.
function M.decide(t, job_desc)
    local is_gpu = M.gpu_request(job_desc)
    if not is_gpu and not (THROTTLE_NON_GPU and t.mode == "reject") then
        return "pass"
    end
    local tail = string.format("until %s%s. Ask %s to lift it.", when(t), because(t), contact_of(t))
    if t.mode == "reject" then
        local what = is_gpu and "GPU jobs" or "jobs"
        return "reject", string.format("gpuslurm: %s of user %s are refused %s%s", what, t.user, tail,
                                        is_gpu and " Jobs without GPUs are not affected." or "")
    elseif t.mode == "cap" then
        local changes, why = M.cap_request(job_desc, t.value)
        if changes == nil then
            return "reject", string.format("gpuslurm: user %s is limited to %d GPU(s) per job: %s; "
                                           .. "ask for fewer (e.g. --gpus=%d) %s",
                                           t.user, t.value, why, t.value, tail)
        end
        if next(changes) == nil then return "pass" end
        return "cap", string.format("gpuslurm: your GPU request was reduced to %d GPU(s) %s",
                                    t.value, tail), changes
    else
        local current = job_desc.nice
        local base = slurm.NICE_OFFSET or 2147483648
        local extra = t.value
        if current ~= nil and current ~= NO_VAL and current - base > extra then
            extra = current - base
        end
        return "nice", string.format("gpuslurm: your GPU job runs with nice %d (lower priority) %s",
                                     extra, tail), { nice = base + extra }
    end
end

local function user_name(job_desc)
    local uid = job_desc.user_id
    local name = uid and cache.names[uid]
    if name == nil then
        name = job_desc.user_name
        if uid and name then cache.names[uid] = name end
    end
    return name
end

local function apply(job_desc, name, action, message, changes)
    if action == "reject" then
        log_info("refused a GPU job of throttled user %s", name)
        slurm.log_user("%s", message)  -- log_user formats its arguments; a "%" in a reason stays text
        return slurm.ERROR
    end
    for field, value in pairs(changes) do
        job_desc[field] = value
    end
    log_info("%s a GPU job of throttled user %s", action == "cap" and "capped" or "reniced", name)
    slurm.log_user("%s", message)  -- log_user formats its arguments; a "%" in a reason stays text
    return slurm.SUCCESS
end

function M.submit(job_desc, now)
    local users, count = M.throttles(now)
    if count == 0 then return slurm.SUCCESS end
    local name = user_name(job_desc)
    local t = name and users[name]
    if not t or t["until"] <= now then return slurm.SUCCESS end
    local action, message, changes = M.decide(t, job_desc)
    if action == "pass" then return slurm.SUCCESS end
    return apply(job_desc, name, action, message, changes)
end

-- A pending job's owner may ask for more GPUs with `scontrol update`: apply the same throttle to
-- the fields the update sets. Operators (uid 0, or anyone with modify_uid ~= the job's user) pass.
function M.modify(job_desc, job_rec, modify_uid, now)
    local users, count = M.throttles(now)
    if count == 0 or modify_uid == 0 or job_rec == nil then return slurm.SUCCESS end
    if job_rec.user_id ~= nil and job_rec.user_id ~= modify_uid then return slurm.SUCCESS end
    local name = job_rec.user_name
    local t = name and users[name]
    if not t or t["until"] <= now then return slurm.SUCCESS end
    local action, message, changes = M.decide(t, job_desc)
    if action == "pass" or action == "nice" then return slurm.SUCCESS end
    return apply(job_desc, name, action, message, changes)
end

-- ---------------------------------------------------------------------------------------------
-- A malformed MPS request in --comment is refused at submission (the prolog would otherwise hold
-- the job on the node). The word is gpuslurm's default [mps] comment_token; "<token>=N" asks for
-- an active thread percentage N of 1-100. Returns nil, or why the comment is refused.

M.MPS_TOKEN = "gpuslurm:mps"

function M.mps_comment_error(comment)
    if type(comment) ~= "string" then return nil end
    local prefix = M.MPS_TOKEN .. "="
    for word in comment:gsub("[,;]", " "):gmatch("%S+") do
        if word:sub(1, #prefix) == prefix then
            local value = word:sub(#prefix + 1)
            local n = value:match("^%d+%.?%d*$") and tonumber(value)
            if not n or n <= 0 or n > 100 then
                return string.format("gpuslurm: malformed MPS request %q in --comment: write %s or "
                                     .. "%s=N with N an active thread percentage of 1-100",
                                     word:sub(1, 80), M.MPS_TOKEN, M.MPS_TOKEN)
            end
        end
    end
    return nil
end

local function mps_checked(fn, job_desc, ...)
    local why = M.mps_comment_error(job_desc.comment)
    if why then
        slurm.log_user("%s", why)
        return slurm.ERROR
    end
    return fn(job_desc, ...)
end

-- ---------------------------------------------------------------------------------------------
-- Slurm's entry points: every failure inside passes the job (fail open) and is logged.

local function guarded(fn, ...)
    local ok, rc = pcall(fn, ...)
    if ok then return rc end
    log_error("internal error, job let through: %s", tostring(rc))
    return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    return guarded(mps_checked, M.submit, job_desc, os.time())
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return guarded(mps_checked, M.modify, job_desc, job_rec, modify_uid, os.time())
end

gpuslurm_throttle = M

return slurm.SUCCESS
