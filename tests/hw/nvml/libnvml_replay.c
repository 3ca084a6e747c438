/* A test libnvidia-ml.so.1 that serves gpuslurm's nvml.json (src/gpuslurm/hw/replay/nvml_replay.py)
 * through NVIDIA's own nvml.h ABI. Input is hostile: every field is validated at nvmlInit; a
 * file it cannot serve makes nvmlInit fail and says why in GPUSLURM_NVML_REPLAY_LOG. */
#include <nvml.h>
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#define MAX_GPUS 64
#define MAX_MIG 8
#define MAX_CPUS 4096
#define NVLINKS 18
#define MAX_PROCS 64

/* A GPU instance (one per GI id on a GPU) and its GPU-instance profile. */
struct nvmlGpuInstance_st {
    struct nvmlDevice_st *device;
    int id, profile; /* profile: index into the device's gi_profiles */
};
struct gi_profile {
    int index, id, slices, sm;   /* index: NVML_GPU_INSTANCE_PROFILE_*, id: the profile id */
    unsigned long long mem_mib;
    char name[48];               /* "3g.40gb" */
};
/* A compute instance: one per MIG device. */
struct nvmlComputeInstance_st {
    struct nvmlGpuInstance_st *gi;
    struct nvmlDevice_st *mig;
};

struct nvmlDevice_st {
    int index, minor, parent, is_mig, gi, ci, sm_count, gi_slices, ci_slices;
    char uuid[96], name[96], bus[32];
    char profile[48];            /* MIG device: its full profile name ("1c.3g.40gb") */
    struct nvmlGpuInstance_st *gpu_instance;
    struct nvmlComputeInstance_st compute_instance;
    int ngis, nprofiles;
    struct nvmlGpuInstance_st gis[MAX_MIG];
    struct gi_profile gi_profiles[MAX_MIG];
    unsigned long long mem_bytes;
    int mig_mode, mig_count;
    struct nvmlDevice_st *mig[MAX_MIG];
    int nvlinks;
    char nvlink_remote[NVLINKS][32]; /* "" = switch */
    int topo[MAX_GPUS];
    /* health facts (health.json): -1 = not supported */
    int temp_c, ecc_unc, remap_pending, remap_failed, retired_pending, lost;
    long long reserved_mib, used_mib, clock_events;
    int cc_major, cc_minor; /* nvml.json's optional "compute_capability": "9.0"; 0: not known */
    unsigned long affinity[MAX_CPUS / (8 * sizeof(unsigned long))];
};

static struct nvmlDevice_st gpus[MAX_GPUS], migs[MAX_GPUS * MAX_MIG];
static int gpu_count, init_count;
static char driver[80];
static int cuda_version, driver_major, driver_minor, privileged;

/* What changes with time: one state per scenario step (hw/replay/scenario.py's readings, computed by
 * nvml_replay.py), the one in force chosen by the clock plus GPUSLURM_NVML_REPLAY_CLOCK seconds. */
#define MAX_STEPS 4096
#define SLOTS (1 + MAX_MIG) /* per GPU: the GPU itself, then its MIG devices */
struct dev_now { double util, used_mib, power_w, temp_c, ecc, energy_mj; int lost; }; /* < 0: not known */
struct proc_now { int gpu, mig; unsigned int pid; double used_mib; int sm; }; /* mig -1: none */
struct state { double at; struct dev_now *dev; int nprocs; struct proc_now *procs; };
static struct state base, *steps;
static int nsteps;
/* timed events (replay_events.c, included at the end): read per step, freed with the steps */
static int events_load(const cJSON *list, int step, double at, const char *where);
static void events_free(void);

static void say(const char *fmt, ...) {
    const char *path = getenv("GPUSLURM_NVML_REPLAY_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f ? f : stderr, fmt, ap);
    va_end(ap);
    fputc('\n', f ? f : stderr);
    if (f) fclose(f);
}

static int copy_str(char *dst, size_t size, const cJSON *v) {
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= size) return -1;
    strcpy(dst, v->valuestring);
    return 0;
}

static int get_int(const cJSON *v, long lo, long hi, int *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long)v->valuedouble) return -1;
    if (v->valuedouble < lo || v->valuedouble > hi) return -1;
    *out = (int)v->valuedouble;
    return 0;
}

#define NEED(cond, ...) do { if (!(cond)) { say(__VA_ARGS__); return -1; } } while (0)

/* NVML_GPU_INSTANCE_PROFILE_* by slice count, and the profile ids an A100 reports for them
 * (ids are not indexes: a backend that mixes the two up reads the wrong profile). */
static const int SLICE_PROFILE[9] = {-1, 0, 1, 2, 3, -1, 6, 4, 5};
static const int PROFILE_ID[18] = {19, 14, 9, 5, 0, 1, 2, 20, 21, 15, 22, 23, 24, 25, 26, 27, 28, 29};

/* The GPU instance of MIG device ``d`` (made on its first device) and its profile. */
static int attach_instances(struct nvmlDevice_st *g, struct nvmlDevice_st *d) {
    const char *gi_name = d->profile;
    const char *dot = strchr(d->profile, '.');
    if (d->profile[0] && dot && dot[-1] == 'c') gi_name = dot + 1; /* "1c.3g.40gb" -> "3g.40gb" */
    int p, k;
    for (p = 0; p < g->nprofiles && strcmp(g->gi_profiles[p].name, gi_name) != 0; p++) {}
    if (p == g->nprofiles) {
        NEED(p < MAX_MIG, "GPU %d: more than %d MIG profiles", g->index, MAX_MIG);
        struct gi_profile *prof = &g->gi_profiles[p];
        int index = SLICE_PROFILE[d->gi_slices], taken;
        if (strstr(gi_name, "+me") || index < 0) index = 7; /* the *_REV1 and later profiles */
        do { /* a second profile with the same slice count (1g.10gb and 1g.20gb) takes a later index */
            taken = 0;
            for (k = 0; k < g->nprofiles; k++) taken |= g->gi_profiles[k].index == index;
            if (taken) index = index < 7 ? 7 : index + 1;
        } while (taken && index < 18);
        NEED(index < 18, "GPU %d: too many MIG profiles", g->index);
        memset(prof, 0, sizeof *prof);
        strcpy(prof->name, gi_name);
        prof->index = index;
        prof->id = PROFILE_ID[index];
        prof->slices = d->gi_slices;
        prof->mem_mib = d->mem_bytes >> 20;
        g->nprofiles++;
    }
    if (d->ci_slices == d->gi_slices) g->gi_profiles[p].sm = d->sm_count;
    for (k = 0; k < g->ngis && g->gis[k].id != d->gi; k++) {}
    if (k == g->ngis) {
        g->gis[k].device = g;
        g->gis[k].id = d->gi;
        g->gis[k].profile = p;
        g->ngis++;
    }
    NEED(g->gis[k].profile == p, "GPU %d: GPU instance %d has devices of two profiles", g->index, d->gi);
    d->gpu_instance = &g->gis[k];
    d->compute_instance.gi = &g->gis[k];
    d->compute_instance.mig = d;
    return 0;
}

static int get_num(const cJSON *v, double lo, double hi, double *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) return -1;
    *out = v->valuedouble;
    return 0;
}
/* an optional number (null or absent: -1) */
static int opt_num(const cJSON *o, const char *key, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    *out = -1;
    return (!v || cJSON_IsNull(v)) ? 0 : get_num(v, 0, hi, out);
}
static int opt_bool(const cJSON *o, const char *key, int *out) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    *out = -1;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return -1;
    *out = cJSON_IsTrue(v);
    return 0;
}

static int load_health(struct nvmlDevice_st *g, const cJSON *h) {
    double t, e, u, r, c;
    g->temp_c = g->ecc_unc = g->remap_pending = g->remap_failed = g->retired_pending = -1;
    g->lost = 0;
    g->reserved_mib = 0;
    g->used_mib = g->clock_events = -1;
    if (!h || cJSON_IsNull(h)) return 0;
    NEED(cJSON_IsObject(h), "GPU %d: health is not an object", g->index);
    NEED(opt_num(h, "temperature_c", 1000, &t) == 0 && opt_num(h, "ecc_uncorrectable", 1e9, &e) == 0 &&
         opt_num(h, "memory_used_mib", 1 << 24, &u) == 0 && opt_num(h, "memory_reserved_mib", 1 << 24, &r) == 0 &&
         opt_num(h, "clock_event_reasons", 1e15, &c) == 0,
         "GPU %d: a health number is missing its range", g->index);
    NEED(opt_bool(h, "remap_pending", &g->remap_pending) == 0 && opt_bool(h, "remap_failed", &g->remap_failed) == 0 &&
         opt_bool(h, "retired_pages_pending", &g->retired_pending) == 0 && opt_bool(h, "lost", &g->lost) == 0,
         "GPU %d: a health flag is not true or false", g->index);
    NEED((g->remap_pending < 0) == (g->remap_failed < 0), "GPU %d: remap_pending and remap_failed go together",
         g->index);
    if (g->lost < 0) g->lost = 0;
    g->temp_c = (int)t;
    g->ecc_unc = (int)e;
    g->used_mib = (long long)u;
    g->reserved_mib = r < 0 ? 0 : (long long)r;
    g->clock_events = (long long)c;
    return 0;
}

/* processes: a list of {gpu, mig, pid, used_mib, sm}; the GPU and MIG slot must exist */
static int load_procs(const cJSON *list, struct state *st, const char *where) {
    int n = 0, cap = cJSON_GetArraySize(list);
    const cJSON *v;
    NEED(cap <= MAX_GPUS * MAX_PROCS, "%s: more than %d processes", where, MAX_GPUS * MAX_PROCS);
    st->procs = calloc((size_t)(cap ? cap : 1), sizeof *st->procs);
    NEED(st->procs, "%s: out of memory", where);
    cJSON_ArrayForEach(v, list) {
        struct proc_now *p = &st->procs[n];
        int pid;
        double used, sm;
        NEED(cJSON_IsObject(v) && get_int(cJSON_GetObjectItem(v, "gpu"), 0, gpu_count - 1, &p->gpu) == 0 &&
             get_int(cJSON_GetObjectItem(v, "mig"), -1, MAX_MIG - 1, &p->mig) == 0 &&
             get_int(cJSON_GetObjectItem(v, "pid"), 1, 1 << 30, &pid) == 0 &&
             opt_num(v, "used_mib", 1 << 24, &used) == 0 && opt_num(v, "sm", 100, &sm) == 0,
             "%s: process %d needs gpu, mig, pid and a used_mib and sm in range", where, n);
        NEED(p->mig < gpus[p->gpu].mig_count, "%s: process %d: GPU %d has no MIG device %d", where, n, p->gpu, p->mig);
        p->pid = (unsigned)pid;
        p->used_mib = used;
        p->sm = (int)sm;
        int on_gpu = 0;
        for (int k = 0; k <= n; k++) on_gpu += st->procs[k].gpu == p->gpu;
        NEED(on_gpu <= MAX_PROCS, "%s: more than %d processes on GPU %d", where, MAX_PROCS, p->gpu);
        n++;
    }
    st->nprocs = n;
    return 0;
}

/* a second nvmlInit after nvmlShutdown reads the file again */
static void free_state(void) {
    for (int k = 0; k < nsteps; k++) { free(steps[k].dev); free(steps[k].procs); }
    free(steps);
    free(base.dev);
    free(base.procs);
    events_free();
    steps = NULL;
    nsteps = 0;
    memset(&base, 0, sizeof base);
}

static int load_steps(const cJSON *list) {
    const cJSON *s, *v;
    char where[48];
    int k = 0;
    NEED(!list || cJSON_IsArray(list), "replay.steps must be a list");
    int count = list ? cJSON_GetArraySize(list) : 0;
    NEED(count <= MAX_STEPS, "replay.steps: more than %d steps", MAX_STEPS);
    steps = calloc((size_t)(count ? count : 1), sizeof *steps);
    NEED(steps, "out of memory");
    nsteps = count;
    cJSON_ArrayForEach(s, list) {
        struct state *st = &steps[k];
        snprintf(where, sizeof where, "replay.steps[%d]", k);
        NEED(cJSON_IsObject(s) && get_num(cJSON_GetObjectItem(s, "at"), 0, 1e11, &st->at) == 0,
             "%s needs \"at\" (Unix seconds)", where);
        NEED(k == 0 || st->at >= steps[k - 1].at, "%s: steps must be in time order", where);
        st->dev = calloc((size_t)(gpu_count ? gpu_count : 1) * SLOTS, sizeof *st->dev);
        NEED(st->dev, "out of memory");
        for (int i = 0; i < gpu_count * SLOTS; i++)
            st->dev[i].util = st->dev[i].used_mib = st->dev[i].power_w = st->dev[i].temp_c = st->dev[i].ecc =
                st->dev[i].energy_mj = -1;
        cJSON_ArrayForEach(v, cJSON_GetObjectItem(s, "devices")) {
            int gpu, mig, lost;
            NEED(cJSON_IsObject(v) && get_int(cJSON_GetObjectItem(v, "gpu"), 0, gpu_count - 1, &gpu) == 0 &&
                 get_int(cJSON_GetObjectItem(v, "mig"), -1, MAX_MIG - 1, &mig) == 0,
                 "%s: a device needs gpu and mig", where);
            struct dev_now *d = &st->dev[gpu * SLOTS + mig + 1];
            NEED(opt_num(v, "util", 100, &d->util) == 0 && opt_num(v, "mem_used_mib", 1 << 24, &d->used_mib) == 0 &&
                 opt_num(v, "power_w", 1e5, &d->power_w) == 0 && opt_num(v, "temp_c", 1000, &d->temp_c) == 0 &&
                 opt_bool(v, "lost", &lost) == 0 && opt_num(v, "ecc_uncorrectable", 1e9, &d->ecc) == 0 &&
                 opt_num(v, "energy_mj", 1e18, &d->energy_mj) == 0,
                 "%s: GPU %d: util, mem_used_mib, power_w, temp_c, lost, ecc_uncorrectable or energy_mj out of range",
                 where, gpu);
            d->lost = lost > 0;
            NEED(d->ecc < 0 || mig < 0, "%s: GPU %d: ecc_uncorrectable on a MIG device", where, gpu);
            if (d->ecc >= 0 && gpus[gpu].ecc_unc < 0) gpus[gpu].ecc_unc = 0; /* ECC on: 0 until the step */
        }
        if (load_procs(cJSON_GetObjectItem(s, "processes"), st, where) ||
            events_load(cJSON_GetObjectItem(s, "events"), k, st->at, where)) return -1;
        k++;
    }
    return 0;
}

/* the state before the first step (or without steps): idle, the static processes, health facts */
static int load_base(const cJSON *procs) {
    base.dev = calloc((size_t)(gpu_count ? gpu_count : 1) * SLOTS, sizeof *base.dev);
    NEED(base.dev, "out of memory");
    for (int i = 0; i < gpu_count * SLOTS; i++) {
        struct dev_now *d = &base.dev[i];
        d->util = 0;
        d->used_mib = d->power_w = d->temp_c = d->ecc = d->energy_mj = -1;
    }
    for (int g = 0; g < gpu_count; g++) {
        base.dev[g * SLOTS].used_mib = (double)gpus[g].used_mib;
        base.dev[g * SLOTS].lost = gpus[g].lost;
    }
    return procs && !cJSON_IsNull(procs) ? load_procs(procs, &base, "replay.processes") : 0;
}

static double replay_now(void) {
    struct timespec ts;
    const char *off = getenv("GPUSLURM_NVML_REPLAY_CLOCK");
    double shift = 0;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (off) {
        char *end;
        shift = strtod(off, &end);
        if (*end || !(shift > -1e10 && shift < 1e10)) shift = 0; /* garbage: no shift (logged at init) */
    }
    return (double)ts.tv_sec + ts.tv_nsec / 1e9 + shift;
}
static const struct state *now_state(void) {
    double now = replay_now();
    const struct state *st = &base;
    for (int k = 0; k < nsteps && steps[k].at <= now; k++) st = &steps[k];
    return st;
}
static const struct dev_now *dev_now(const struct state *st, nvmlDevice_t d) {
    return &st->dev[(d->is_mig ? d->parent : d->index) * SLOTS + (d->is_mig ? d->index + 1 : 0)];
}
/* memory used: the step's figure, else health's (GPU), else the sum of the device's processes */
static unsigned long long used_bytes(const struct state *st, nvmlDevice_t d) {
    double mib = dev_now(st, d)->used_mib;
    if (mib < 0) {
        mib = 0;
        int gpu = d->is_mig ? d->parent : d->index;
        for (int i = 0; i < st->nprocs; i++)
            if (st->procs[i].gpu == gpu && (!d->is_mig || st->procs[i].mig == d->index) && st->procs[i].used_mib > 0)
                mib += st->procs[i].used_mib;
    }
    return (unsigned long long)llround(mib * 1048576.0);
}

static int load_mig(struct nvmlDevice_st *g, const cJSON *m, int slot) {
    struct nvmlDevice_st *d = &migs[g->index * MAX_MIG + slot];
    int mib;
    memset(d, 0, sizeof *d);
    d->is_mig = 1;
    d->parent = g->index;
    d->index = slot;
    NEED(cJSON_IsObject(m), "GPU %d: MIG device %d is not an object", g->index, slot);
    NEED(get_int(cJSON_GetObjectItem(m, "gi_id"), 0, 64, &d->gi) == 0 &&
         get_int(cJSON_GetObjectItem(m, "ci_id"), 0, 64, &d->ci) == 0 &&
         get_int(cJSON_GetObjectItem(m, "memory_mib"), 0, 1 << 24, &mib) == 0,
         "GPU %d: MIG device %d: gi_id, ci_id or memory_mib missing or out of range", g->index, slot);
    d->mem_bytes = (unsigned long long)mib << 20;
    /* profile "<g>g.<GiB>gb" or "<c>c.<g>g.<GiB>gb": the slice counts NVML reports */
    const cJSON *prof = cJSON_GetObjectItem(m, "profile");
    int a = 0, b = 0, used = 0;
    NEED(cJSON_IsString(prof), "GPU %d: MIG %d: profile missing", g->index, slot);
    if (sscanf(prof->valuestring, "%dc.%dg.%n", &a, &b, &used) == 2 && used) {
        d->ci_slices = a; d->gi_slices = b;
    } else if (sscanf(prof->valuestring, "%dg.%n", &a, &used) == 1 && used) {
        d->ci_slices = d->gi_slices = a;
    }
    NEED(d->gi_slices >= 1 && d->gi_slices <= 8 && d->ci_slices >= 1 && d->ci_slices <= d->gi_slices,
         "GPU %d: MIG %d: profile %.40s is not <c>c.<g>g.<n>gb", g->index, slot, prof->valuestring);
    NEED(copy_str(d->profile, sizeof d->profile, prof) == 0, "GPU %d: MIG %d: profile too long", g->index, slot);
    const cJSON *sm = cJSON_GetObjectItem(m, "sm_count");
    d->sm_count = 0;
    if (sm && !cJSON_IsNull(sm))
        NEED(get_int(sm, 0, 100000, &d->sm_count) == 0, "GPU %d: MIG %d: bad sm_count", g->index, slot);
    const cJSON *u = cJSON_GetObjectItem(m, "uuid");
    if (u && !cJSON_IsNull(u))
        NEED(copy_str(d->uuid, sizeof d->uuid, u) == 0, "GPU %d: MIG %d: bad uuid", g->index, slot);
    snprintf(d->name, sizeof d->name, "%s MIG", g->name);
    strcpy(d->bus, g->bus);
    d->minor = g->minor;
    g->mig[slot] = d;
    return attach_instances(g, d);
}

static int load_gpu(const cJSON *j, const cJSON *r, int pos) {
    struct nvmlDevice_st *g = &gpus[pos];
    int mib, c, n = 0;
    const cJSON *v;
    memset(g, 0, sizeof *g);
    NEED(cJSON_IsObject(j), "GPU %d is not an object", pos);
    NEED(get_int(cJSON_GetObjectItem(j, "index"), pos, pos, &g->index) == 0,
         "GPU %d: index missing or not its position", pos);
    NEED(get_int(cJSON_GetObjectItem(j, "minor"), 0, 255, &g->minor) == 0, "GPU %d: bad minor", pos);
    NEED(get_int(cJSON_GetObjectItem(j, "memory_mib"), 0, 1 << 24, &mib) == 0, "GPU %d: bad memory_mib", pos);
    g->mem_bytes = (unsigned long long)mib << 20;
    NEED(copy_str(g->uuid, sizeof g->uuid, cJSON_GetObjectItem(j, "uuid")) == 0, "GPU %d: bad uuid", pos);
    NEED(copy_str(g->name, sizeof g->name, cJSON_GetObjectItem(j, "name")) == 0, "GPU %d: bad name", pos);
    NEED(copy_str(g->bus, sizeof g->bus, cJSON_GetObjectItem(j, "bus_id")) == 0,
         "GPU %d: bad bus_id", pos);
    v = cJSON_GetObjectItem(j, "compute_capability");
    if (v && !cJSON_IsNull(v))
        NEED(cJSON_IsString(v) && sscanf(v->valuestring, "%d.%d", &g->cc_major, &g->cc_minor) == 2 &&
             g->cc_major > 0 && g->cc_major < 100 && g->cc_minor >= 0 && g->cc_minor < 100,
             "GPU %d: compute_capability is not <major>.<minor>", pos);
    v = cJSON_GetObjectItem(j, "mig_mode");
    g->mig_mode = cJSON_IsTrue(v) ? 1 : cJSON_IsFalse(v) ? 0 : -1;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(j, "cpu_affinity")) {
        NEED(get_int(v, 0, MAX_CPUS - 1, &c) == 0, "GPU %d: bad CPU in cpu_affinity", pos);
        g->affinity[c / (8 * sizeof(unsigned long))] |= 1UL << (c % (8 * sizeof(unsigned long)));
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(j, "mig_devices")) {
        NEED(n < MAX_MIG, "GPU %d: more than %d MIG devices", pos, MAX_MIG);
        if (load_mig(g, v, n++)) return -1;
    }
    g->mig_count = n;
    NEED(cJSON_IsObject(r), "replay entry for GPU %d missing", pos);
    n = 0;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(r, "nvlinks")) {
        NEED(n < NVLINKS, "GPU %d: more than %d NVLinks", pos, NVLINKS);
        NEED(cJSON_IsString(v), "GPU %d: NVLink %d is not a string", pos, n);
        if (strcmp(v->valuestring, "switch") == 0) g->nvlink_remote[n][0] = 0;
        else NEED(copy_str(g->nvlink_remote[n], 32, v) == 0, "GPU %d: bad NVLink remote", pos);
        n++;
    }
    g->nvlinks = n;
    if (load_health(g, cJSON_GetObjectItem(r, "health"))) return -1;
    n = 0;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(r, "topology")) {
        NEED(n < MAX_GPUS && get_int(v, -1, 70, &g->topo[n]) == 0, "GPU %d: bad topology level", pos);
        n++;
    }
    return 0;
}

/* The nvml.json baked in at build time (-DGPUSLURM_NVML_REPLAY_PATH="..."), for processes that get
 * no GPUSLURM_NVML_REPLAY: the hooks slurmd runs. Root reads it, so it is checked as gpuslurm's
 * safedir checks a root path: each component opened below its parent without following symlinks,
 * every directory root's or ours and not writable by others (an ancestor may be sticky, as /tmp),
 * the file a regular file, root's or ours, not writable by group or others. */
#ifdef GPUSLURM_NVML_REPLAY_PATH
static int checked_owner(const struct stat *st, const char *what, const char *path, int sticky_ok) {
    if (st->st_uid != 0 && st->st_uid != geteuid()) { say("%s: %s owned by uid %u", path, what, (unsigned)st->st_uid); return -1; }
    if ((st->st_mode & 022) && !(sticky_ok && (st->st_mode & S_ISVTX))) {
        say("%s: %s writable by group or others (mode %04o)", path, what, (unsigned)(st->st_mode & 07777));
        return -1;
    }
    return 0;
}

static FILE *open_baked(const char *path) {
    char copy[4096], *parts[256], *save = NULL;
    struct stat st;
    int fd, child, n = 0, i;
    if (path[0] != '/' || strlen(path) >= sizeof copy) { say("%s: not an absolute path", path); return NULL; }
    strcpy(copy, path);
    for (char *p = strtok_r(copy, "/", &save); p; p = strtok_r(NULL, "/", &save)) {
        if (n == 256) { say("%s: too deep", path); return NULL; }
        parts[n++] = p;
    }
    if (n == 0) { say("%s: not a file", path); return NULL; }
    fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) || checked_owner(&st, "directory", path, n > 1)) goto fail;
    for (i = 0; i < n; i++) {
        int file = i == n - 1;
        child = openat(fd, parts[i], (file ? O_NONBLOCK : O_DIRECTORY) | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        fd = child;
        if (fd < 0) { say("%s: cannot open %s (missing, or a symlink)", path, parts[i]); return NULL; }
        if (fstat(fd, &st)) goto fail;
        if (file && !S_ISREG(st.st_mode)) { say("%s: not a regular file", path); goto fail; }
        /* a sticky ancestor (/tmp) is fine: others cannot rename our entries; the file's own
         * directory and the file never get that exception */
        if (checked_owner(&st, file ? "the file" : "a directory", path, i < n - 2)) goto fail;
    }
    return fdopen(fd, "rb");
fail:
    if (fd >= 0) close(fd);
    return NULL;
}
#endif

static int load(void) {
    const char *path = getenv("GPUSLURM_NVML_REPLAY");
    FILE *f;
    long size;
    char *text;
    cJSON *root, *list, *replay, *rg, *v;
    int pos = 0, rc = -1;
    free_state();
#ifdef GPUSLURM_NVML_REPLAY_PATH
    if (!path) {
        path = GPUSLURM_NVML_REPLAY_PATH;
        f = open_baked(path);
        NEED(f, "cannot serve %s (baked in at build time)", path);
    } else
#endif
    {
        NEED(path, "GPUSLURM_NVML_REPLAY is not set");
        f = fopen(path, "rb");
        NEED(f, "cannot open %s", path);
    }
    if (fseek(f, 0, SEEK_END) || (size = ftell(f)) < 0 || size > (16 << 20) || fseek(f, 0, SEEK_SET)) {
        fclose(f);
        NEED(0, "%s: unreadable or larger than 16 MiB", path);
    }
    text = calloc(1, (size_t)size + 1);
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) {
        free(text);
        fclose(f);
        NEED(0, "%s: cannot read", path);
    }
    fclose(f);
    root = cJSON_Parse(text);
    free(text);
    NEED(root, "%s: not valid JSON", path);
    v = cJSON_GetObjectItem(root, "format");
    if (!cJSON_IsString(v) || strcmp(v->valuestring, "gpuslurm-nvml") != 0) {
        say("%s: not a gpuslurm NVML dump", path);
        goto out;
    }
    v = cJSON_GetObjectItem(root, "driver_version");
    driver[0] = 0;
    if (v && !cJSON_IsNull(v) && copy_str(driver, sizeof driver, v)) { say("bad driver_version"); goto out; }
    v = cJSON_GetObjectItem(root, "cuda_version");
    cuda_version = 0;
    if (cJSON_IsString(v)) {
        int major = 0, minor = 0;
        if (sscanf(v->valuestring, "%d.%d", &major, &minor) != 2 || major < 0 || major > 99 || minor < 0 || minor > 99) {
            say("bad cuda_version"); goto out;
        }
        cuda_version = major * 1000 + minor * 10;
    }
    replay = cJSON_GetObjectItem(root, "replay");
    if (!cJSON_IsObject(replay)) { say("%s: no \"replay\" section (write it with gpuslurm.hw.replay.nvml_replay)", path); goto out; }
    driver_major = driver_minor = 0;
    if (driver[0] && sscanf(driver, "%d.%d", &driver_major, &driver_minor) != 2) {
        say("driver_version %.40s is not <major>.<minor>", driver); goto out;
    }
    /* NVML answers GPU/compute-instance lookups only to a privileged user */
    v = cJSON_GetObjectItem(replay, "privileged");
    privileged = !cJSON_IsFalse(v);
    if (v && !cJSON_IsBool(v)) { say("replay.privileged must be true or false"); goto out; }
    list = cJSON_GetObjectItem(root, "gpus");
    rg = cJSON_GetObjectItem(replay, "gpus");
    if (!cJSON_IsArray(list) || !cJSON_IsArray(rg) || cJSON_GetArraySize(list) != cJSON_GetArraySize(rg)
        || cJSON_GetArraySize(list) > MAX_GPUS) {
        say("%s: gpus and replay.gpus must be lists of equal length (at most %d)", path, MAX_GPUS);
        goto out;
    }
    cJSON_ArrayForEach(v, list) {
        if (load_gpu(v, cJSON_GetArrayItem(rg, pos), pos)) goto out;
        pos++;
    }
    gpu_count = pos;
    if (load_base(cJSON_GetObjectItem(replay, "processes")) || load_steps(cJSON_GetObjectItem(replay, "steps")))
        goto out;
    v = NULL;
    {
        const char *off = getenv("GPUSLURM_NVML_REPLAY_CLOCK");
        char *end;
        if (off && (strtod(off, &end), *end || end == off)) {
            say("GPUSLURM_NVML_REPLAY_CLOCK=%.40s is not a number of seconds", off);
            goto out;
        }
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

/* -- lifecycle -------------------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (init_count == 0 && load()) return NVML_ERROR_UNKNOWN;
    init_count++;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) {
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    init_count--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

#define READY() do { if (!init_count) return NVML_ERROR_UNINITIALIZED; } while (0)
#define DEV(d) do { READY(); if (!(d)) return NVML_ERROR_INVALID_ARGUMENT; \
    if (is_lost(d)) return NVML_ERROR_GPU_IS_LOST; } while (0)

static int is_lost(nvmlDevice_t d) {
    int gpu = d->is_mig ? d->parent : d->index;
    return gpus[gpu].lost || now_state()->dev[gpu * SLOTS].lost;
}

static nvmlReturn_t put_str(char *dst, unsigned int len, const char *s) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, s);
    return NVML_SUCCESS;
}

/* -- system ----------------------------------------------------------------------------------- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
    READY();
    return driver[0] ? put_str(v, len, driver) : NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) {
    READY();
    if (!driver[0]) return NVML_ERROR_NOT_SUPPORTED;
    char buf[96];
    snprintf(buf, sizeof buf, "%d.%s", 10 + (driver_major >= 400 ? driver_major / 10 - 40 : 0), driver);
    return put_str(v, len, buf);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    if (!cuda_version) return NVML_ERROR_NOT_SUPPORTED;
    *v = cuda_version;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* -- devices ---------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    READY();
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)gpu_count;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    READY();
    if (!d || i >= (unsigned)gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &gpus[i];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    READY();
    if (!uuid || !d) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < gpu_count; i++)
        if (strcmp(gpus[i].uuid, uuid) == 0) { *d = &gpus[i]; return NVML_SUCCESS; }
    return NVML_ERROR_NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d) {
    READY();
    if (!bus || !d) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < gpu_count; i++)
        if (strcasecmp(gpus[i].bus, bus) == 0) { *d = &gpus[i]; return NVML_SUCCESS; }
    return NVML_ERROR_NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *v, unsigned int len) { DEV(d); return put_str(v, len, d->name); }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *v, unsigned int len) {
    DEV(d);
    return d->uuid[0] ? put_str(v, len, d->uuid) : NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m) {
    DEV(d);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *m = (unsigned)d->minor;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) {
    DEV(d);
    if (!i) return NVML_ERROR_INVALID_ARGUMENT;
    *i = (unsigned)d->index;
    return NVML_SUCCESS;
}

static void fill_pci(nvmlPciInfo_t *p, const char *bus) {
    unsigned dom = 0, b = 0, dev = 0, fn = 0;
    memset(p, 0, sizeof *p);
    sscanf(bus, "%x:%x:%x.%x", &dom, &b, &dev, &fn);
    snprintf(p->busId, sizeof p->busId, "%s", bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04x:%02x:%02x.%x", dom & 0xffff, b, dev, fn);
    p->domain = dom;
    p->bus = b;
    p->device = dev;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    DEV(d);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(p, d->bus);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }

/* v2 keeps the driver's reserved memory apart; v1's "used" includes it */
static unsigned long long reserved_bytes(nvmlDevice_t d) {
    return d->is_mig ? 0 : (unsigned long long)d->reserved_mib << 20;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    DEV(d);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long used = used_bytes(now_state(), d) + reserved_bytes(d);
    m->total = d->mem_bytes;
    m->used = used;
    m->free = used < d->mem_bytes ? d->mem_bytes - used : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    DEV(d);
    if (!m || m->version != nvmlMemory_v2) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long used = used_bytes(now_state(), d), reserved = reserved_bytes(d);
    m->total = d->mem_bytes;
    m->reserved = reserved;
    m->used = used;
    m->free = used + reserved < d->mem_bytes ? d->mem_bytes - used - reserved : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t d, unsigned int words, unsigned long *set) {
    DEV(d);
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < words; i++)
        set[i] = i < sizeof d->affinity / sizeof d->affinity[0] ? d->affinity[i] : 0;
    return NVML_SUCCESS;
}

/* -- MIG -------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending) {
    DEV(d);
    if (!cur || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    *cur = *pending = (unsigned)d->mig_mode;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n) {
    DEV(d);
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    *n = d->mig_mode ? MAX_MIG : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int i, nvmlDevice_t *m) {
    DEV(d);
    if (!m || i >= MAX_MIG) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    if (i >= (unsigned)d->mig_count) return NVML_ERROR_NOT_FOUND;
    *m = d->mig[i];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is) {
    DEV(d);
    if (!is) return NVML_ERROR_INVALID_ARGUMENT;
    *is = (unsigned)d->is_mig;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    DEV(d);
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *id = (unsigned)d->gi;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    DEV(d);
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *id = (unsigned)d->ci;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a) {
    DEV(d);
    if (!a) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    memset(a, 0, sizeof *a);
    a->multiprocessorCount = (unsigned)d->sm_count;
    a->memorySizeMB = d->mem_bytes >> 20;
    a->gpuInstanceSliceCount = (unsigned)d->gi_slices;
    a->computeInstanceSliceCount = (unsigned)d->ci_slices;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *parent) {
    DEV(d);
    if (!parent) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = &gpus[d->parent];
    return NVML_SUCCESS;
}

/* -- GPU and compute instances ----------------------------------------------------------------- */

static const struct gi_profile *gi_profile(nvmlDevice_t d, unsigned int index) {
    for (int p = 0; p < d->nprofiles; p++)
        if ((unsigned)d->gi_profiles[p].index == index) return &d->gi_profiles[p];
    return NULL;
}
#define MIG_PARENT(d) do { DEV(d); if ((d)->is_mig) return NVML_ERROR_INVALID_ARGUMENT; \
    if ((d)->mig_mode != 1) return NVML_ERROR_NOT_SUPPORTED; } while (0)

/* R545 added version 3 of the GPU- and compute-instance profile structs (nvidia-settings'
 * src/nvml.h from 545.23.06): GI v3 drops isP2pSupported after id and appends capabilities, so its
 * fields sit 4 bytes earlier than v2's from sliceCount on; CI v3 appends capabilities. The *V
 * queries take v2 "or later": a driver before R545 refuses v3 (INVALID_ARGUMENT, as for any
 * version it does not know), R545 and later write each version's own layout. No driver version:
 * the newest. */
static int knows_profile_info_v3(void) { return !driver[0] || driver_major >= 545; }
_Static_assert(offsetof(nvmlGpuInstanceProfileInfo_v3_t, sliceCount) + 4 ==
               offsetof(nvmlGpuInstanceProfileInfo_v2_t, sliceCount), "GI profile v3 has no isP2pSupported");
_Static_assert(offsetof(nvmlComputeInstanceProfileInfo_v3_t, capabilities) ==
               sizeof(nvmlComputeInstanceProfileInfo_v2_t), "CI profile v3 appends capabilities");

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    MIG_PARENT(d);
    if (!info || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = info->version;
    if (version != nvmlGpuInstanceProfileInfo_v2 &&
        !(version == nvmlGpuInstanceProfileInfo_v3 && knows_profile_info_v3()))
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct gi_profile *p = gi_profile(d, profile);
    if (!p) return NVML_ERROR_NOT_SUPPORTED;
    nvmlGpuInstanceProfileInfo_v2_t v2;
    memset(&v2, 0, sizeof v2);
    v2.version = version;
    v2.id = (unsigned)p->id;
    v2.sliceCount = (unsigned)p->slices;
    v2.instanceCount = (unsigned)(7 / p->slices);
    v2.multiprocessorCount = (unsigned)p->sm;
    v2.memorySizeMB = p->mem_mib;
    snprintf(v2.name, sizeof v2.name, "MIG %s", p->name);
    if (version == nvmlGpuInstanceProfileInfo_v2) {
        *info = v2;
        return NVML_SUCCESS;
    }
    nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)(void *)info;
    memset(v3, 0, sizeof *v3);
    v3->version = version;
    v3->id = v2.id;
    v3->sliceCount = v2.sliceCount;
    v3->instanceCount = v2.instanceCount;
    v3->multiprocessorCount = v2.multiprocessorCount;
    v3->memorySizeMB = v2.memorySizeMB;
    memcpy(v3->name, v2.name, sizeof v3->name);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    nvmlGpuInstanceProfileInfo_v2_t v2 = {.version = nvmlGpuInstanceProfileInfo_v2};
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = nvmlDeviceGetGpuInstanceProfileInfoV(d, profile, &v2);
    if (r != NVML_SUCCESS) return r;
    memset(info, 0, sizeof *info);
    info->id = v2.id;
    info->sliceCount = v2.sliceCount;
    info->instanceCount = v2.instanceCount;
    info->multiprocessorCount = v2.multiprocessorCount;
    info->memorySizeMB = v2.memorySizeMB;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *gi) {
    MIG_PARENT(d);
    if (!gi) return NVML_ERROR_INVALID_ARGUMENT;
    if (!privileged) return NVML_ERROR_NO_PERMISSION;
    for (int k = 0; k < d->ngis; k++)
        if ((unsigned)d->gis[k].id == id) { *gi = &d->gis[k]; return NVML_SUCCESS; }
    return NVML_ERROR_NOT_FOUND;
}
nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    READY();
    if (!gi || !info) return NVML_ERROR_INVALID_ARGUMENT;
    const struct gi_profile *p = &gi->device->gi_profiles[gi->profile];
    memset(info, 0, sizeof *info);
    info->device = gi->device;
    info->id = (unsigned)gi->id;
    info->profileId = (unsigned)p->id;
    info->placement.size = (unsigned)p->slices;
    return NVML_SUCCESS;
}
/* NVML_COMPUTE_INSTANCE_PROFILE_* by slice count; a CI profile's id is its index */
static int ci_slices_of(unsigned int profile) {
    for (int s = 1; s <= 8; s++)
        if (SLICE_PROFILE[s] >= 0 && (unsigned)SLICE_PROFILE[s] == profile) return s;
    return 0;
}
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gi, unsigned int profile,
                                                           unsigned int eng, nvmlComputeInstanceProfileInfo_v2_t *info) {
    READY();
    if (!gi || !info || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT || eng >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = info->version;
    if (version != nvmlComputeInstanceProfileInfo_v2 &&
        !(version == nvmlComputeInstanceProfileInfo_v3 && knows_profile_info_v3()))
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct gi_profile *p = &gi->device->gi_profiles[gi->profile];
    int slices = ci_slices_of(profile);
    if (!slices || slices > p->slices) return NVML_ERROR_NOT_SUPPORTED;
    /* v3 is v2 plus capabilities at the end: zeroing the larger struct covers both */
    if (version == nvmlComputeInstanceProfileInfo_v3) memset(info, 0, sizeof(nvmlComputeInstanceProfileInfo_v3_t));
    else memset(info, 0, sizeof *info);
    info->version = version;
    info->id = profile;
    info->sliceCount = (unsigned)slices;
    info->instanceCount = (unsigned)(p->slices / slices);
    if (slices == p->slices) snprintf(info->name, sizeof info->name, "MIG %s", p->name);
    else snprintf(info->name, sizeof info->name, "MIG %dc.%s", slices, p->name);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gi, unsigned int id, nvmlComputeInstance_t *ci) {
    READY();
    if (!gi || !ci) return NVML_ERROR_INVALID_ARGUMENT;
    if (!privileged) return NVML_ERROR_NO_PERMISSION;
    for (int m = 0; m < gi->device->mig_count; m++) {
        struct nvmlDevice_st *mig = gi->device->mig[m];
        if (mig->gpu_instance == gi && (unsigned)mig->ci == id) { *ci = &mig->compute_instance; return NVML_SUCCESS; }
    }
    return NVML_ERROR_NOT_FOUND;
}
nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info) {
    READY();
    if (!ci || !info) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->device = ci->gi->device;
    info->gpuInstance = ci->gi;
    info->id = (unsigned)ci->mig->ci;
    info->profileId = (unsigned)SLICE_PROFILE[ci->mig->ci_slices];
    info->placement.size = (unsigned)ci->mig->ci_slices;
    return NVML_SUCCESS;
}

/* -- links ------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, nvmlEnableState_t *s) {
    DEV(d);
    if (!s || link >= NVLINKS) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->mig_mode == 1) return NVML_ERROR_NOT_SUPPORTED;
    if (!d->nvlinks) return NVML_ERROR_NOT_SUPPORTED;
    *s = link < (unsigned)d->nvlinks ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t d, unsigned int link, nvmlIntNvLinkDeviceType_t *t) {
    DEV(d);
    if (!t || link >= (unsigned)d->nvlinks) return NVML_ERROR_INVALID_ARGUMENT;
    *t = d->nvlink_remote[link][0] ? NVML_NVLINK_DEVICE_TYPE_GPU : NVML_NVLINK_DEVICE_TYPE_SWITCH;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *p) {
    DEV(d);
    if (!p || link >= (unsigned)d->nvlinks) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(p, d->nvlink_remote[link][0] ? d->nvlink_remote[link] : "00000000:00:00.0");
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, nvmlGpuTopologyLevel_t *l) {
    DEV(a);
    if (!b || !l || a->is_mig || b->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    int level = a->topo[b->index];
    if (level < 0) return NVML_ERROR_NOT_SUPPORTED;
    *l = (nvmlGpuTopologyLevel_t)level;
    return NVML_SUCCESS;
}

/* -- readings (the scenario step in force, health facts) ---------------------------------------- */

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    DEV(d);
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->mig_mode == 1) return NVML_ERROR_NOT_SUPPORTED; /* no utilisation in MIG mode */
    double util = dev_now(now_state(), d)->util;
    u->gpu = util < 0 ? 0 : (unsigned)lround(util);
    u->memory = 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    DEV(d);
    if (!mw) return NVML_ERROR_INVALID_ARGUMENT;
    double w = d->is_mig ? -1 : dev_now(now_state(), d)->power_w;
    if (w < 0) return NVML_ERROR_NOT_SUPPORTED;
    *mw = (unsigned)lround(w * 1000);
    return NVML_SUCCESS;
}
/* The total energy counter (mJ since the driver loaded): the step's energy_mj; a step may make it
 * fall, as a driver reload or GPU reset does. Not supported where the steps do not give it. */
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    DEV(d);
    if (!mj) return NVML_ERROR_INVALID_ARGUMENT;
    double e = d->is_mig ? -1 : dev_now(now_state(), d)->energy_mj;
    if (e < 0) return NVML_ERROR_NOT_SUPPORTED;
    *mj = (unsigned long long)llround(e);
    return NVML_SUCCESS;
}
static nvmlReturn_t temperature(nvmlDevice_t d, nvmlTemperatureSensors_t s, unsigned int *t) {
    DEV(d);
    if (!t || s != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    double c = dev_now(now_state(), d)->temp_c;
    if (c < 0) c = d->temp_c; /* the step says nothing: the health fact */
    if (c < 0) return NVML_ERROR_NOT_SUPPORTED;
    *t = (unsigned)lround(c);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t s, unsigned int *t) {
    return temperature(d, s, t);
}
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t d, nvmlTemperature_t *t) {
    unsigned int c;
    if (!t || t->version != nvmlTemperature_v1) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = temperature(d, t->sensorType, &c);
    if (r == NVML_SUCCESS) t->temperature = (int)c;
    return r;
}

/* -- what nvitop's and gpustat's main views ask besides ------------------------------------------ */

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t d, unsigned int *v) {
    DEV(d); return v ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *v) {
    DEV(d); return v ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t d, nvmlPstates_t *v) {
    DEV(d); return v ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, nvmlClockType_t type, unsigned int *clock) {
    DEV(d); (void)type; return clock ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, nvmlClockType_t type, unsigned int *clock) {
    DEV(d); (void)type; return clock ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, nvmlPcieUtilCounter_t counter, unsigned int *value) {
    DEV(d); (void)counter; return value ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t d, nvmlDriverModel_t *cur, nvmlDriverModel_t *pending) {
    DEV(d); (void)cur; (void)pending; return NVML_ERROR_NOT_SUPPORTED; /* Windows only */
}
static nvmlReturn_t state(nvmlDevice_t d, nvmlEnableState_t *v, nvmlEnableState_t value) {
    DEV(d);
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *v = value;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t d, nvmlEnableState_t *v) { return state(d, v, NVML_FEATURE_DISABLED); }
nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t d, nvmlEnableState_t *v) { return state(d, v, NVML_FEATURE_DISABLED); }
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, nvmlEnableState_t *v) { return state(d, v, NVML_FEATURE_ENABLED); }
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, nvmlComputeMode_t *mode) {
    DEV(d);
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = NVML_COMPUTEMODE_DEFAULT;
    return NVML_SUCCESS;
}
static nvmlReturn_t codec(nvmlDevice_t d, unsigned int *util, unsigned int *period) {
    DEV(d);
    if (!util || !period) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *util = 0; /* a bundle replays no video work */
    *period = 167000;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) { return codec(d, u, p); }
nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) { return codec(d, u, p); }
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    DEV(d);
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    const struct nvmlDevice_st *g = d->is_mig ? &gpus[d->parent] : d;
    if (!g->cc_major) return NVML_ERROR_NOT_SUPPORTED;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

/* -- health: ECC, row remapping, retired pages, clock events ------------------------------------ */

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t d, nvmlEnableState_t *cur, nvmlEnableState_t *pending) {
    DEV(d);
    if (!cur || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->ecc_unc < 0) return NVML_ERROR_NOT_SUPPORTED;
    *cur = *pending = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, nvmlMemoryErrorType_t type, nvmlEccCounterType_t counter,
                                         unsigned long long *count) {
    DEV(d);
    if (!count || type >= NVML_MEMORY_ERROR_TYPE_COUNT || counter >= NVML_ECC_COUNTER_TYPE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->ecc_unc < 0) return NVML_ERROR_NOT_SUPPORTED;
    double now = dev_now(now_state(), d)->ecc; /* a step's count (carried forward), else health's */
    *count = type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? (unsigned long long)(now >= 0 ? now : d->ecc_unc) : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc, unsigned int *pending,
                                       unsigned int *failure) {
    DEV(d);
    if (!corr || !unc || !pending || !failure) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->remap_pending < 0) return NVML_ERROR_NOT_SUPPORTED;
    *corr = 0;
    *unc = (unsigned)(d->remap_pending || d->remap_failed);
    *pending = (unsigned)d->remap_pending;
    *failure = (unsigned)d->remap_failed;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, nvmlEnableState_t *pending) {
    DEV(d);
    if (!pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->retired_pending < 0) return NVML_ERROR_NOT_SUPPORTED;
    *pending = d->retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *reasons) {
    DEV(d);
    if (!reasons) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->clock_events < 0) return NVML_ERROR_NOT_SUPPORTED;
    *reasons = (unsigned long long)d->clock_events;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(d, reasons);
}

/* The struct behind _v3 gained usedGpuCcProtectedMemory in R535 without a version bump; 535.98
 * dropped the _v3 entry points again and R550 brought them back with the 24-byte struct (the field
 * moved to nvmlProcessDetail_v1_t), so the stride a driver writes follows its version. */
struct proc_r535 { unsigned int pid; unsigned long long used; unsigned int gi, ci; unsigned long long cc; };
_Static_assert(sizeof(struct proc_r535) == 32, "R535 process-info layout");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "header's nvmlProcessInfo_t is the pre-R535 layout");

static int wide_process_info(void) { return driver_major == 535 && driver_minor < 98; }

/* A GPU's handle answers every process on it (in MIG mode too: NVML's aggregate view for root);
 * a MIG device's only its own. */
static int on_device(const struct proc_now *p, nvmlDevice_t d) {
    return d->is_mig ? p->gpu == d->parent && p->mig == d->index : p->gpu == d->index;
}
static unsigned long long proc_bytes(const struct proc_now *p) {
    return p->used_mib < 0 ? ~0ULL : (unsigned long long)llround(p->used_mib * 1048576.0);
}

static nvmlReturn_t processes(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_t *p, int wide) {
    DEV(d);
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    const struct state *st = now_state();
    unsigned have = 0, room = *n, k = 0;
    for (int i = 0; i < st->nprocs; i++) have += (unsigned)on_device(&st->procs[i], d);
    *n = have;
    if (have > room || (have && !p)) return NVML_ERROR_INSUFFICIENT_SIZE;
    /* never write past a caller's array sized for the 24-byte layout (a real R535 driver would) */
    if (wide && have * sizeof(struct proc_r535) > room * sizeof(nvmlProcessInfo_t)) {
        say("process list: the caller's array holds %u 24-byte entries, too few for %u R535 entries",
            room, have);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < st->nprocs; i++) {
        const struct proc_now *q = &st->procs[i];
        if (!on_device(q, d)) continue;
        unsigned gi = q->mig < 0 ? 0xFFFFFFFF : (unsigned)gpus[q->gpu].mig[q->mig]->gi;
        unsigned ci = q->mig < 0 ? 0xFFFFFFFF : (unsigned)gpus[q->gpu].mig[q->mig]->ci;
        if (wide) {
            struct proc_r535 *w = (struct proc_r535 *)(void *)p + k;
            memset(w, 0, sizeof *w);
            w->pid = q->pid; w->used = proc_bytes(q); w->gi = gi; w->ci = ci;
        } else {
            memset(&p[k], 0, sizeof p[k]);
            p[k].pid = q->pid; p[k].usedGpuMemory = proc_bytes(q);
            p[k].gpuInstanceId = gi; p[k].computeInstanceId = ci;
        }
        k++;
    }
    return NVML_SUCCESS;
}
static nvmlReturn_t no_processes(nvmlDevice_t d, unsigned int *n) {
    DEV(d);
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_t *p) {
    return processes(d, n, p, wide_process_info());
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_v2_t *p) {
    return processes(d, n, (nvmlProcessInfo_t *)(void *)p, 0);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_t *p) {
    (void)p; return no_processes(d, n);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *n, nvmlProcessInfo_v2_t *p) {
    (void)p; return no_processes(d, n);
}
/* R550: the versioned list, each entry with usedGpuCcProtectedMemory */
nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t d, nvmlProcessDetailList_t *list) {
    DEV(d);
    if (!list || list->version != nvmlProcessDetailList_v1 || list->mode >= NVML_PROCESS_MODE_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessInfo_t info[MAX_PROCS];
    unsigned int have = MAX_PROCS;
    if (list->mode == NVML_PROCESS_MODE_GRAPHICS || list->mode == NVML_PROCESS_MODE_MPS) have = 0;
    else {
        nvmlReturn_t r = processes(d, &have, info, 0);
        if (r != NVML_SUCCESS) return r;
    }
    unsigned room = list->numProcArrayEntries;
    list->numProcArrayEntries = have;
    if (have > room || (have && !list->procArray)) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned i = 0; i < have; i++) {
        memset(&list->procArray[i], 0, sizeof list->procArray[i]);
        list->procArray[i].pid = info[i].pid;
        list->procArray[i].usedGpuMemory = info[i].usedGpuMemory;
        list->procArray[i].gpuInstanceId = info[i].gpuInstanceId;
        list->procArray[i].computeInstanceId = info[i].computeInstanceId;
    }
    return NVML_SUCCESS;
}
/* R535: present (confidential computing); these GPUs do not run in that mode */
nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t d, nvmlConfComputeMemSizeInfo_t *m) {
    DEV(d); (void)m; return NVML_ERROR_NOT_SUPPORTED;
}
/* per-process SM utilisation: one sample per process the step gives an "sm", stamped with the step */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *s, unsigned int *n,
                                             unsigned long long last) {
    DEV(d);
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig || d->mig_mode == 1) return NVML_ERROR_NOT_SUPPORTED; /* not on MIG-enabled GPUs */
    const struct state *st = now_state();
    /* NVML keeps sampling: the newest sample of a process in the step was taken a moment ago */
    unsigned long long stamp = (unsigned long long)(replay_now() * 1e6) - 1000;
    if (st == &base) return NVML_ERROR_NOT_FOUND;
    unsigned have = 0, room = *n;
    for (int i = 0; i < st->nprocs; i++)
        have += (unsigned)(on_device(&st->procs[i], d) && st->procs[i].sm >= 0 && stamp > last);
    if (!have) return NVML_ERROR_NOT_FOUND;
    *n = have;
    if (!s || have > room) return NVML_ERROR_INSUFFICIENT_SIZE;
    unsigned k = 0;
    for (int i = 0; i < st->nprocs; i++) {
        const struct proc_now *q = &st->procs[i];
        if (!(on_device(q, d) && q->sm >= 0 && stamp > last)) continue;
        memset(&s[k], 0, sizeof s[k]);
        s[k].pid = q->pid;
        s[k].timeStamp = stamp;
        s[k].smUtil = (unsigned)q->sm;
        k++;
    }
    return NVML_SUCCESS;
}

/* NVML events (nvmlEventSet*, nvmlDeviceRegisterEvents): their own file */
#include "replay_events.c"
