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
    cap:      given at most `value` GPUs in all, per job (see cap_request below; a batch job's
              SLURM_GPUS* and SLURM_TRES_PER_TASK follow; srun and salloc over the cap are
              refused, see M.decide);
    priority: given `value` more nice (a lower priority).
Jobs without GPUs pass. `scontrol update` of a job by its throttled owner is judged on the job as
it will be after the update (see M.modify; docs/throttle.md). The file is read at most every
RELOAD_SECONDS; a missing, unreadable or broken file, or any error in this script's own logic,
lets every job through (fail open) and is logged to slurmctld's log: a throttle must never become
an outage.
--]]

local RELOAD_SECONDS = 3
-- nil: the file "gpuslurm-throttle" beside this script, i.e. in slurm.conf's directory.
local THROTTLE_FILE = nil
local DEFAULT_CONTACT = "your cluster administrators"
local THROTTLE_NON_GPU = false   -- true: reject mode refuses every job of the user, GPU or not
local GPU_GRES = { gpu = true, mps = true, shard = true }  -- gres names (any case) that mean "uses a GPU"
local TRES_FIELDS = { "tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task" }

local NO_VAL = 4294967294     -- Slurm's NO_VAL: the field was not set
local NO_VAL16 = 65534
local MAX_BYTES = 16 * 1024 * 1024   -- a larger file is not gpuslurm's: nobody throttled, logged
local MAX_LINE = 4096                -- a longer line is junk, never pattern-matched
local MAX_DIGITS = 12                -- until, value, created
local TIME_MAX = 253370764800        -- 9999-01-01T00:00:00Z: the range gpuslurm.times documents
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

-- One line to a throttle, or nil for junk. The same rules as gpuslurm.slurm.throttle._parse_line:
-- until, value and created at most MAX_DIGITS digits, the times within 1970..TIME_MAX.
function M.parse_line(line)
    if #line > MAX_LINE then return nil end
    local user, until_s, mode, value, created, contact, reason = line:match(
        "^([^\t%s#][^\t%s]*)\t(%d+)\t(%l+)\t(%d+)\t(%d+)\t([^\t]*)\t([^\t]*)$")
    if not user or not MODES[mode] then return nil end
    if #until_s > MAX_DIGITS or #value > MAX_DIGITS or #created > MAX_DIGITS then return nil end
    local u, c = tonumber(until_s), tonumber(created)
    if u > TIME_MAX or c > TIME_MAX then return nil end
    value = tonumber(value)
    if mode ~= "reject" and value < 1 then return nil end
    return { user = user, ["until"] = u, mode = mode, value = value,
             contact = contact, reason = reason }
end

-- The text of a throttle file to a table user -> throttle. Returns users, junk count, first junk
-- line number, doubtful count. Every doubt lets the job through: a junk line whose first field
-- names a user takes that user out of the table, whatever their other lines say.
function M.parse_text(text, now)
    local users, doubtful, junk, first_junk, number, ndoubt = {}, {}, 0, nil, 0, 0
    for raw in text:gmatch("([^\n]*)\n?") do
        number = number + 1
        local line = raw
        if line:sub(-1) == "\r" then line = line:sub(1, -2) end
        if line == "" or line:sub(1, 1) == "#" or (#line <= MAX_LINE and line:find("^%s*$")) then
            -- comment or blank
        else
            local t = M.parse_line(line)
            if t == nil then
                junk = junk + 1
                first_junk = first_junk or number
                local who = line:sub(1, 256):match("^([^\t%s]+)\t")
                if who and not doubtful[who] then
                    doubtful[who], users[who], ndoubt = true, nil, ndoubt + 1
                end
            elseif t["until"] > now and not doubtful[t.user] then
                users[t.user] = t   -- the last unexpired line of a user wins
            end
        end
    end
    return users, junk, first_junk, ndoubt
end

-- The file's whole text, at most MAX_BYTES; nil and why when it cannot be read or is larger.
-- (Lua 5.1 cannot stat: a FIFO here would block slurmctld in io.open. The file's directory must
-- be writable by root only, which every `gpuslurm throttle` command and `gpuslurm install`
-- check; see docs/throttle.md.)
function M.read_text(path)
    local fh, err = io.open(path, "rb")
    if not fh then return nil, err end
    local ok, text, rerr = pcall(fh.read, fh, MAX_BYTES + 1)
    fh:close()
    if not ok then return nil, tostring(text) end
    if text == nil and rerr then return nil, tostring(rerr) end
    text = text or ""   -- nil at once: an empty file
    if #text > MAX_BYTES then return nil, string.format("larger than %d bytes", MAX_BYTES) end
    return text
end

-- Kept for tests and tools: read and parse in one go.
function M.read_file(path, now)
    local text, err = M.read_text(path)
    if text == nil then return nil, err end
    return M.parse_text(text, now)
end

local cache = { checked = nil, text = nil, users = {}, count = 0, state = nil, names = {}, parses = 0 }
M.cache = cache

-- The current throttles, re-read at most every RELOAD_SECONDS and parsed again only when the
-- file's content changed (Lua interns strings: an unchanged file compares equal at once). A file
-- that could not be read, or held only junk, is cached like any other: never re-parsed per call.
function M.throttles(now)
    if cache.checked and now >= cache.checked and now - cache.checked < RELOAD_SECONDS then
        return cache.users, cache.count
    end
    cache.checked = now
    local path = M.path or M.default_path()
    local text, err = M.read_text(path)
    if text == nil then
        if cache.state ~= "missing" then
            log_info("throttle file %s not readable (%s): no user is throttled", path, tostring(err))
        end
        cache.state, cache.users, cache.count, cache.text = "missing", {}, 0, nil
        return cache.users, 0
    end
    if cache.state == "ok" and cache.text == text then
        if cache.expires and now >= cache.expires then
            -- same text, but a throttle ended: count again so expired users drop out of the table
        else
            return cache.users, cache.count
        end
    end
    cache.parses = cache.parses + 1
    local users, junk, first_junk, ndoubt = M.parse_text(text, now)
    local count, expires = 0, nil
    for _, t in pairs(users) do
        count = count + 1
        if expires == nil or t["until"] < expires then expires = t["until"] end
    end
    if junk > 0 then
        log_error("throttle file %s: skipped %d junk line(s), the first at line %d; %d user(s) named "
                  .. "by a junk line are not throttled", path, junk, first_junk, ndoubt)
    end
    if cache.state ~= "ok" or count ~= cache.count then
        log_info("throttle file %s: %d user(s) throttled", path, count)
    end
    cache.state, cache.users, cache.count, cache.text, cache.expires = "ok", users, count, text, expires
    cache.names, cache.nnames = {}, 0  -- uid -> name cache: refreshed with the file
    return users, count
end

-- ---------------------------------------------------------------------------------------------
-- GPU requests in the job descriptor

local SUFFIX = { [""] = 1, k = 1024, m = 1024 * 1024, g = 1024 * 1024 * 1024 }

-- One tres item ("gres:gpu:2", "gres/gpu:h100:2", "gpu", "gres/gpu=4", "gres:mps:50") to
-- {name=, type=, count=, prefix=, sep=}; nil for items that are not gres (cpu=4, license...).
-- Names compare case-insensitively (name_l). An item of a GPU gres whose tail this cannot read
-- ("gpu:a:b:2", "gpu:h100:4:foo") is {unparsed=true}: still a GPU request, never capped.
function M.parse_item(item)
    local prefix, rest = item:match("^(gres[:/])(.*)$")
    if not prefix then prefix, rest = "", item end
    local name, tail = rest:match("^([%w_%-]+)(.*)$")
    if not name then return nil end
    local r = { name = name, name_l = name:lower(), prefix = prefix, sep = ":", count = 1 }
    if tail == "" then return r end
    -- [":" type] (":" | "=") count[suffix]  or  ":" type
    local typ, sep, num, suf = tail:match("^:([^:=]+)([:=])(%d+)(%a?)$")
    if not typ then
        sep, num, suf = tail:match("^([:=])(%d+)(%a?)$")
    end
    if num then
        local mult = SUFFIX[suf:lower()]
        if mult then
            r.type, r.sep, r.count = typ, sep, tonumber(num) * mult
            return r
        end
    else
        typ = tail:match("^:([^:=,]+)$")
        if typ then r.type = typ; return r end
    end
    if GPU_GRES[r.name_l] then r.unparsed = true; return r end
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
                if r and GPU_GRES[r.name_l] and (r.unparsed or r.count > 0) then return true, field end
            end
        end
    end
    return false
end

-- A count Slurm set (not NO_VAL/NO_VAL16/INFINITE, not 0); else nil.
local function known(n)
    if type(n) == "number" and n > 0 and n < NO_VAL16 then return n end
    return nil
end

-- How many nodes the job may get: the larger of a known min_nodes and max_nodes, else 1.
local function nodes_of(job_desc)
    local n = known(job_desc.min_nodes) or 1
    local m = known(job_desc.max_nodes)
    if m and m > n then n = m end
    return n
end

-- How many of each field's unit the job has in all: the cap is per job, so a per-node count is
-- multiplied by the nodes, a per-socket one by sockets x nodes, a per-task one by the tasks
-- (unknown: --ntasks-per-node x nodes, else one per node). Returns the multiplier and the unit's
-- name.
local function units(job_desc, field)
    local nodes = nodes_of(job_desc)
    if field == "tres_per_job" then return 1, "job" end
    if field == "tres_per_node" then return nodes, "node(s)" end
    if field == "tres_per_socket" then
        return (known(job_desc.sockets_per_node) or 1) * nodes, "socket(s)"
    end
    local per_node = known(job_desc.ntasks_per_node)
    return known(job_desc.num_tasks) or (per_node and per_node * nodes) or nodes, "task(s)"
end

-- The tres_per_* fields that ask for GPUs (gpu gres only: shares do not add GPUs): a set.
local function gpu_fields(job_desc)
    local found = {}
    for _, field in ipairs(TRES_FIELDS) do
        local value = job_desc[field]
        if value ~= nil and value ~= "" then
            for _, item in ipairs(split(value)) do
                local r = M.parse_item(item)
                if r and r.name_l == "gpu" and (r.unparsed or r.count > 0) then found[field] = true end
            end
        end
    end
    return found
end

-- Limit the gpu counts in the request so the job gets at most `cap` GPUs in all (the cap is per
-- job): the GPU items of each field are summed (gres:gpu:h100:2,gres:gpu:a100:2 is 4 per unit),
-- and if that sum times the units exceeds the cap, the field keeps floor(cap / units) per unit,
-- given to its GPU items in order (an item left with none is dropped).
-- Returns a table field -> new value (only changed fields), or nil and a reason when the request
-- cannot be capped (more nodes, sockets or tasks with GPUs than the cap, or a GPU request this
-- cannot read).
function M.cap_request(job_desc, cap)
    local changes = {}
    for _, field in ipairs(TRES_FIELDS) do
        local value = job_desc[field]
        if value ~= nil and value ~= "" then
            local many, unit = units(job_desc, field)
            local items, parsed, sum = split(value), {}, 0
            for i, item in ipairs(items) do
                local r = M.parse_item(item)
                if r and r.unparsed and r.name_l == "gpu" then
                    return nil, string.format("cannot read the GPU request %q", item:sub(1, 64))
                end
                if r and r.name_l == "gpu" then
                    parsed[i] = r
                    sum = sum + r.count
                end
            end
            if sum * many > cap then
                local left = math.floor(cap / many)
                if left < 1 then
                    return nil, string.format("%d %s with GPUs exceed the cap of %d GPU(s)",
                                              many, unit, cap)
                end
                local kept = {}
                for i, item in ipairs(items) do
                    local r = parsed[i]
                    if r == nil then
                        kept[#kept + 1] = item
                    elseif left > 0 then
                        r.count = math.min(r.count, left)
                        left = left - r.count
                        kept[#kept + 1] = M.format_item(r)
                    end
                end
                changes[field] = table.concat(kept, ",")
            end
        end
    end
    -- Per-node, per-socket and per-task counts were judged on nodes_of(job_desc) nodes. With no
    -- maximum, Slurm gives the job as many nodes as its tasks or CPUs need (`-n 64 --gres=gpu:2`
    -- on 32-CPU nodes: 2 nodes, 4 GPUs), each with the same GPUs: hold it to the nodes judged.
    -- A known task count fixes per-task GPUs whatever the nodes.
    local per_unit = gpu_fields(job_desc)
    if (per_unit.tres_per_node or per_unit.tres_per_socket
            or (per_unit.tres_per_task and not known(job_desc.num_tasks)))
            and not known(job_desc.max_nodes) then
        changes.max_nodes = nodes_of(job_desc)
    end
    return changes
end

-- The variables sbatch and salloc write from --gpus, --gpus-per-node, --gpus-per-socket and
-- --gpus-per-task (Slurm's set_env_from_opts), which a bare `srun` in the job reads back as its
-- own request. --gres writes none.
local GPU_ENV = { tres_per_job = "SLURM_GPUS", tres_per_node = "SLURM_GPUS_PER_NODE",
                  tres_per_socket = "SLURM_GPUS_PER_SOCKET", tres_per_task = "SLURM_GPUS_PER_TASK" }

-- A capped field's GPU items in the option's own form ("h100:2,4"), for its variable.
function M.gpu_option(value)
    local parts = {}
    for _, item in ipairs(split(value)) do
        local r = M.parse_item(item)
        if r and r.name_l == "gpu" and not r.unparsed then
            parts[#parts + 1] = (r.type and (r.type .. ":") or "") .. string.format("%d", r.count)
        end
    end
    return table.concat(parts, ",")
end

-- Is this a batch job (sbatch), whose environment slurmctld keeps and the plugin may rewrite?
-- srun and salloc send no environment: they build their own from the request they sent.
local function is_batch(job_desc)
    local script = job_desc.script
    return type(script) == "string" and script ~= ""
end

-- SLURM_TRES_PER_TASK ("cpu=4,gres/gpu=3"), which sbatch writes for --gpus-per-task on
-- releases that fold it into --tres-per-task (24.11 and later; SLURM_GPUS_PER_TASK is then
-- unset): its GPU items take the lowered field's counts, type by type; its other items stay.
function M.capped_tres_per_task(text, lowered)
    local counts = {}
    for _, item in ipairs(split(lowered)) do
        local r = M.parse_item(item)
        if r and r.name_l == "gpu" and not r.unparsed then counts[r.type or ""] = r.count end
    end
    local items = {}
    for _, item in ipairs(split(text)) do
        local r = M.parse_item(item)
        local count = r and r.prefix ~= "" and r.name_l == "gpu" and not r.unparsed and counts[r.type or ""]
        if count then
            r.count = count
            item = M.format_item(r)
        end
        items[#items + 1] = item
    end
    return table.concat(items, ",")
end

-- The job's SLURM_GPUS* (and SLURM_TRES_PER_TASK) variables that a lowered field would
-- contradict: variable -> the new value, only for variables the job's environment holds.
function M.capped_env(job_desc, changes)
    local env = job_desc.environment
    local out = {}
    if env == nil then return out end
    for field, var in pairs(GPU_ENV) do
        if changes[field] and env[var] ~= nil then out[var] = M.gpu_option(changes[field]) end
    end
    local tres = env.SLURM_TRES_PER_TASK
    if changes.tres_per_task and type(tres) == "string" and #tres <= MAX_LINE then
        out.SLURM_TRES_PER_TASK = M.capped_tres_per_task(tres, changes.tres_per_task)
    end
    return out
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
        local lowered = false
        for field in pairs(GPU_ENV) do lowered = lowered or changes[field] ~= nil end
        if lowered and not is_batch(job_desc) then
            -- srun and salloc keep the request they sent (their steps, their shell's SLURM_GPUS*):
            -- a lowered job would fail at its first step. Refused with the count that fits.
            return "reject", string.format("gpuslurm: user %s is limited to %d GPU(s) per job: srun "
                                           .. "and salloc requests are not lowered; ask for at most "
                                           .. "%d (e.g. --gpus=%d) %s",
                                           t.user, t.value, t.value, t.value, tail)
        end
        if changes.max_nodes and next(changes, nil) == "max_nodes" and next(changes, "max_nodes") == nil then
            return "cap", string.format("gpuslurm: your GPU job may use at most %d node(s), so that it "
                                        .. "has at most %d GPU(s) %s", changes.max_nodes, t.value, tail),
                changes
        end
        local nodes = changes.max_nodes
            and string.format(" on at most %d node(s)", changes.max_nodes) or ""
        return "cap", string.format("gpuslurm: your GPU request was reduced to %d GPU(s)%s %s",
                                    t.value, nodes, tail), changes
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

local MAX_NAMES = 65536   -- uid -> name entries kept; past this the cache starts again

local function remember(uid, name)
    if type(uid) ~= "number" or type(name) ~= "string" then return end
    if cache.nnames and cache.nnames >= MAX_NAMES then cache.names, cache.nnames = {}, 0 end
    if cache.names[uid] == nil then cache.nnames = (cache.nnames or 0) + 1 end
    cache.names[uid] = name
end

local function user_name(job_desc)
    local uid = job_desc.user_id
    local name = uid and cache.names[uid]
    if name == nil then
        name = job_desc.user_name
        remember(uid, name)
    end
    return name
end

-- The name of the job's owner on `scontrol update`. The owner is job_rec.user_id: Slurm leaves
-- job_rec.user_name nil in slurmctld (22.05 and later), so a name read there matches no throttle.
-- The name comes from the uid -> name cache the submissions fill, else from job_desc.user_name:
-- before calling the plugin slurmctld sets the update's user_id to the owner's uid (unless root
-- overrode it with `scontrol -u`), and job_desc.user_name resolves that uid through the system's
-- own user database (NSS, as at submission: LDAP and sssd users included), once per uid until
-- the throttle file changes. Reading /etc/passwd ourselves would miss every directory user.
-- nil when neither names the owner: the update passes (fail open), as a submission would.
local function owner_name(job_desc, job_rec)
    local uid = job_rec.user_id
    if type(uid) ~= "number" then return nil end
    local name = cache.names[uid]
    if name == nil and job_desc.user_id == uid then
        name = job_desc.user_name
        remember(uid, name)
    end
    return name
end

local function apply(job_desc, name, action, message, changes)
    if action == "reject" then
        log_info("refused a GPU job of throttled user %s", name)
        slurm.log_user("%s", message)  -- log_user formats its arguments; a "%" in a reason stays text
        return slurm.ERROR
    end
    local env = M.capped_env(job_desc, changes)
    for field, value in pairs(changes) do
        job_desc[field] = value
    end
    for var, value in pairs(env) do
        job_desc.environment[var] = value   -- the batch step's srun asks for what the job has
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

-- The uid slurmctld runs as: SlurmUser (slurmctld drops root's privileges to it at start). Read
-- once from /proc/self/status (Lua 5.1 has no getuid); false when it cannot be read.
function M.slurm_user_uid()
    if M.slurm_uid == nil then
        M.slurm_uid = false
        local fh = io.open("/proc/self/status", "rb")
        if fh then
            local ok, text = pcall(fh.read, fh, 8192)
            fh:close()
            local uid = ok and type(text) == "string" and text:match("\nUid:%s+(%d+)")
            if uid and #uid <= 10 then M.slurm_uid = tonumber(uid) end
        end
    end
    return M.slurm_uid
end

-- Fields of an update that can change how many GPUs the job gets: its GPU requests, and the
-- node, socket, task and CPU counts they are multiplied by (Slurm spreads a job over more nodes
-- for more tasks or CPUs when its node count has no maximum). An update that sets none of them
-- leaves the GPU count as it was judged at submission.
local SHAPE_NUMBERS = { "min_nodes", "max_nodes", "num_tasks", "ntasks_per_node", "ntasks_per_socket",
                        "ntasks_per_core", "ntasks_per_board", "ntasks_per_tres", "ntasks_per_gpu",
                        "sockets_per_node", "sockets_per_board", "boards_per_node", "cores_per_socket",
                        "threads_per_core", "min_cpus", "max_cpus", "pn_min_cpus", "cpus_per_task" }
local SHAPE_STRINGS = { "req_nodes" }
-- Fields Slurm leaves 0, not NO_VAL16, when an update does not set them.
local ZERO_UNSET = { ntasks_per_board = true, sockets_per_board = true, boards_per_node = true }

-- A number an update sets (Slurm leaves the others NO_VAL or NO_VAL16, or 0 for ZERO_UNSET
-- fields); else nil. INFINITE is set: `NumNodes=ALL`.
local function set_number(n, field)
    if type(n) ~= "number" or n == NO_VAL or n == NO_VAL16 then return nil end
    if n == 0 and ZERO_UNSET[field] then return nil end
    return n
end

-- The job as it will be after the update: the record's fields overlaid with those the update
-- sets (on modify job_desc holds only the changed fields). Returns that job (tres_per_* fields,
-- nodes, sockets, tasks: nil where what the plugin sees cannot tell), whether the update sets a
-- field of the GPU count, and whether it sets the nice.
function M.after_update(job_desc, job_rec)
    local job, shape = {}, false
    for _, field in ipairs(TRES_FIELDS) do
        local value = job_desc[field]
        if value ~= nil then
            job[field], shape = value, true
        else
            job[field] = job_rec[field]
        end
    end
    for _, field in ipairs(SHAPE_NUMBERS) do
        if set_number(job_desc[field], field) then shape = true end
    end
    for _, field in ipairs(SHAPE_STRINGS) do
        if job_desc[field] ~= nil then shape = true end
    end
    local min_set, max_set = set_number(job_desc.min_nodes), set_number(job_desc.max_nodes)
    local min = known(min_set or job_rec.min_nodes)
    local max = known(max_set or job_rec.max_nodes)
    if (min_set and not known(min_set)) or (max_set and not known(max_set)) then
        job.nodes = nil   -- NumNodes=ALL, 0, or no maximum: as many nodes as Slurm sees fit
    elseif max then
        job.nodes = math.max(min or 1, max)
    end
    -- With no node maximum (neither in the record nor in the update) Slurm may spread the job over
    -- more nodes than its minimum when it has many tasks or CPUs, which the record does not show
    -- (22.05 has no task count in job_rec): a GPU count per node, socket or task is then unknown.
    -- 22.05's job_rec shows neither the task count nor the sockets: known only from the update
    job.sockets = known(set_number(job_desc.sockets_per_node) or job_rec.sockets_per_node)
    local tasks = known(set_number(job_desc.num_tasks) or job_rec.num_tasks)
    local per_node = known(set_number(job_desc.ntasks_per_node))
    if per_node and not job.nodes then
        tasks = nil  -- at least ntasks_per_node x nodes, of nodes unknown
    elseif tasks and job.nodes then
        tasks = math.max(tasks, job.nodes, (per_node or 0) * job.nodes)  -- Slurm raises it so
    end
    job.tasks = tasks
    local nice = set_number(job_desc.nice)
    job.nice = nice or set_number(job_rec.nice)
    return job, shape, nice ~= nil
end

-- How many GPUs (gpu gres, not mps/shard shares) the job asks for in all; nil when a field with
-- GPUs has a unit count (nodes, sockets, tasks) the plugin cannot see, or a request it cannot read.
function M.gpu_count(job)
    local total = 0
    for _, field in ipairs(TRES_FIELDS) do
        local value = job[field]
        if value ~= nil and value ~= "" then
            local sum = 0
            for _, item in ipairs(split(value)) do
                local r = M.parse_item(item)
                if r and r.name_l == "gpu" then
                    if r.unparsed then return nil end
                    sum = sum + r.count
                end
            end
            if sum > 0 then
                local many
                if field == "tres_per_job" then many = 1
                elseif field == "tres_per_node" then many = job.nodes
                elseif field == "tres_per_socket" then many = job.sockets and job.nodes and job.sockets * job.nodes
                else many = job.tasks end
                if not many then return nil end
                total = total + sum * many
            end
        end
    end
    return total
end

-- What to do with an update of a throttled user's own job: ("pass"), ("reject", message) or
-- ("nice", message, changes). Judged on the job as it will be after the update.
function M.decide_update(t, job_desc, job_rec)
    local job, shape, sets_nice = M.after_update(job_desc, job_rec)
    local is_gpu = M.gpu_request(job)
    local tail = string.format("until %s%s. Ask %s to lift it.", when(t), because(t), contact_of(t))
    if t.mode == "priority" then
        if not is_gpu or not (shape or sets_nice) then return "pass" end
        local base = slurm.NICE_OFFSET or 2147483648
        local floor = base + t.value
        if sets_nice and job.nice < floor then
            return "reject", string.format("gpuslurm: user %s cannot lower the nice of a GPU job below "
                                           .. "%d %s", t.user, t.value, tail)
        end
        if not sets_nice and (job.nice == nil or job.nice < floor) then
            return "nice", string.format("gpuslurm: your GPU job runs with nice %d (lower priority) %s",
                                         t.value, tail), { nice = floor }
        end
        return "pass"
    end
    if not shape then return "pass" end
    if t.mode == "reject" then return M.decide(t, job) end
    if not is_gpu then return "pass" end
    local count = M.gpu_count(job)
    if count ~= nil and count <= t.value then return "pass" end
    local why = count and string.format("the job would have %d GPU(s)", count)
        or ("the job's GPU count after this update cannot be told "
            .. "(name NumTasks=, ReqSockets= and NumNodes=N-N in it)")
    return "reject", string.format("gpuslurm: user %s is limited to %d GPU(s) per job: %s %s",
                                   t.user, t.value, why, tail)
end

-- `scontrol update` of a job by its owner is judged as the job will be after it (more GPUs, more
-- nodes or tasks with GPUs, a lower nice): the throttle cannot be lifted by an update. Updates by
-- anyone else pass: root, SlurmUser, and operators or coordinators updating another user's job
-- (slurmctld itself refuses a plain user's update of a job not theirs).
function M.modify(job_desc, job_rec, modify_uid, now)
    local users, count = M.throttles(now)
    if count == 0 or job_rec == nil then return slurm.SUCCESS end
    local owner = job_rec.user_id
    if modify_uid == 0 or owner ~= modify_uid or modify_uid == M.slurm_user_uid() then
        return slurm.SUCCESS
    end
    local name = owner_name(job_desc, job_rec)
    local t = name and users[name]
    if not t or t["until"] <= now then return slurm.SUCCESS end
    local action, message, changes = M.decide_update(t, job_desc, job_rec)
    if action == "pass" then return slurm.SUCCESS end
    if action == "reject" then
        log_info("refused an update of job %s of throttled user %s", tostring(job_rec.job_id), name)
        slurm.log_user("%s", message)  -- shown by Slurm 23.02 and later; 22.05 drops it
        return slurm.ERROR
    end
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
-- A GPU memory request in --comment, "gpuslurm:mem>=40G", becomes the node feature
-- gpumem_ge_<X>g that `gpuslurm node-conf` writes (docs/features.md): X is the smallest memory
-- class not below the request, so the feature holds exactly on nodes whose GPUs' class reaches
-- it. The classes are gpuslurm.gres.features.MEMORY_CLASSES_GIB (a test keeps the two equal).
-- Sizes are in GB as GPUs are sold (G, GB, GiB; T; M), a unit is required. Returns nil, or why
-- the request is refused; on success job_desc.features gains the feature (ANDed).

M.MEM_TOKEN = "gpuslurm:mem>="
M.MEMORY_CLASSES_GIB = { 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 144, 180, 192, 256, 288 }
local MEM_UNIT_GIB = { g = 1, t = 1024, m = 1 / 1024 }

function M.mem_feature(word)
    local number, unit = word:sub(#M.MEM_TOKEN + 1):match("^(%d+%.?%d*)([GgTtMm])[Ii]?[Bb]?$")
    local gib = number and #number <= 12 and tonumber(number) * MEM_UNIT_GIB[unit:lower()]
    if not gib or gib <= 0 then
        return nil, string.format("gpuslurm: malformed GPU memory request %q in --comment: write "
                                  .. "%s40G (GB per GPU, with a unit)", word:sub(1, 80), M.MEM_TOKEN)
    end
    for _, c in ipairs(M.MEMORY_CLASSES_GIB) do
        if c >= gib then return string.format("gpumem_ge_%dg", c) end
    end
    local largest = M.MEMORY_CLASSES_GIB[#M.MEMORY_CLASSES_GIB]
    return nil, string.format("gpuslurm: no GPU has %s of memory (%q in --comment; the largest "
                              .. "class is %dG)", word:sub(#M.MEM_TOKEN + 1, 40), word:sub(1, 80), largest)
end

function M.apply_mem_request(job_desc)
    local comment = job_desc.comment
    if type(comment) ~= "string" then return nil end
    for word in comment:gsub("[,;]", " "):gmatch("%S+") do
        if word:sub(1, #M.MEM_TOKEN) == M.MEM_TOKEN then
            local feature, why = M.mem_feature(word)
            if not feature then return why end
            local have = job_desc.features
            if type(have) ~= "string" or have == "" then
                job_desc.features = feature
            elseif have:find("[|%[%]()*]") then
                return string.format("gpuslurm: cannot add %s (from %q in --comment) to "
                                     .. "--constraint=%q: write it into your constraint", feature,
                                     word:sub(1, 80), have:sub(1, 200))
            else
                job_desc.features = have .. "&" .. feature
            end
            slurm.log_user("gpuslurm: %s asks for --constraint=%s", word:sub(1, 80), job_desc.features)
            return nil
        end
    end
    return nil
end

local function mem_checked(fn, job_desc, ...)
    local why = M.apply_mem_request(job_desc)
    if why then
        slurm.log_user("%s", why)
        return slurm.ERROR
    end
    return fn(job_desc, ...)
end

local function submit_checked(job_desc, now)
    return mem_checked(M.submit, job_desc, now)
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
    return guarded(mps_checked, submit_checked, job_desc, os.time())
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return guarded(mps_checked, M.modify, job_desc, job_rec, modify_uid, os.time())
end

gpuslurm_throttle = M

return slurm.SUCCESS
