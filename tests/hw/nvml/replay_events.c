/* NVML events for the replay library (included at the end of libnvml_replay.c, whose state and
 * helpers it uses): the scenario's timed events (nvml.json's replay.steps[].events, written by
 * gpuslurm.hw.replay.nvml_replay) delivered through nvmlEventSetCreate / nvmlDeviceRegisterEvents /
 * nvmlEventSetWait_v2 (and the pre-R450 nvmlEventSetWait) / nvmlEventSetFree.
 *
 * An event is delivered once per event set, at its scenario time (the clock shifted by
 * GPUSLURM_NVML_REPLAY_CLOCK), to a set that registered its GPU for its type before that time:
 * what happened before registration is never seen (NVML's own rule). A GPU falling off the bus
 * is the event type nvmlEventTypeGpuUnavailableError (R565 on); a set that registered the GPU
 * for other types only, or a driver without that type, gets NVML_ERROR_GPU_IS_LOST from the
 * wait instead, once. Input is hostile: every event is checked at nvmlInit. */
#include <pthread.h>

#undef nvmlEventSetWait /* nvml.h maps it to _v2; the library exports both, as drivers do */

#define MAX_EVENTS 65536
#define MAX_STEP_EVENTS (MAX_GPUS * 16)
#define MAX_SETS 16
#define SET_MAGIC 0x6e766576u

struct replay_event { double at; int gpu, mig; unsigned long long type, data; };
static struct replay_event *events;
static int nevents, events_cap;

/* the event types the library can deliver (a known single bit each) */
static const unsigned long long KNOWN_TYPES = nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError |
    nvmlEventTypeXidCriticalError | nvmlEventTypeGpuUnavailableError | nvmlEventTypeGpuRecoveryAction;

static void events_free(void) {
    free(events);
    events = NULL;
    nevents = events_cap = 0;
}

/* one step's events: [{"gpu": N, "mig": -1|slot, "type": bit, "data": N}], in the order given */
static int events_load(const cJSON *list, int step, double at, const char *where) {
    const cJSON *v;
    int n = 0;
    (void)step;
    if (!list || cJSON_IsNull(list)) return 0;
    NEED(cJSON_IsArray(list), "%s: events must be a list", where);
    NEED(cJSON_GetArraySize(list) <= MAX_STEP_EVENTS, "%s: more than %d events", where, MAX_STEP_EVENTS);
    NEED(nevents + cJSON_GetArraySize(list) <= MAX_EVENTS, "%s: more than %d events in all", where, MAX_EVENTS);
    cJSON_ArrayForEach(v, list) {
        struct replay_event e = {.at = at};
        double type, data;
        NEED(cJSON_IsObject(v) && get_int(cJSON_GetObjectItem(v, "gpu"), 0, gpu_count - 1, &e.gpu) == 0 &&
             get_int(cJSON_GetObjectItem(v, "mig"), -1, MAX_MIG - 1, &e.mig) == 0 &&
             get_num(cJSON_GetObjectItem(v, "type"), 1, (double)nvmlEventTypeGpuRecoveryAction, &type) == 0 &&
             get_num(cJSON_GetObjectItem(v, "data"), 0, 1e9, &data) == 0 &&
             type == floor(type) && data == floor(data),
             "%s: event %d needs gpu, mig, a type and whole data in range", where, n);
        e.type = (unsigned long long)type;
        e.data = (unsigned long long)data;
        NEED((e.type & (e.type - 1)) == 0 && (e.type & KNOWN_TYPES), "%s: event %d: type %llu is not one event type",
             where, n, e.type);
        NEED(e.mig < gpus[e.gpu].mig_count, "%s: event %d: GPU %d has no MIG device %d", where, n, e.gpu, e.mig);
        if (nevents == events_cap) {
            int cap = events_cap ? events_cap * 2 : 64;
            struct replay_event *more = realloc(events, (size_t)cap * sizeof *more);
            NEED(more, "%s: out of memory", where);
            events = more;
            events_cap = cap;
        }
        events[nevents++] = e;
        n++;
    }
    return 0;
}

/* What the bundle's driver supports on a GPU: Xid and P-state everywhere; ECC events where ECC is
 * on (health.json or a step gives a count); the GPU-unavailable and recovery-action types from
 * R565 (nvml.h's history). */
static unsigned long long supported_types(nvmlDevice_t d) {
    unsigned long long t = nvmlEventTypeXidCriticalError | nvmlEventTypePState;
    if (d->ecc_unc >= 0) t |= nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError;
    if (driver_major >= 565) t |= nvmlEventTypeGpuUnavailableError | nvmlEventTypeGpuRecoveryAction;
    return t;
}

struct nvmlEventSet_st {
    unsigned int magic;
    unsigned long long types[MAX_GPUS]; /* registered per GPU */
    double since[MAX_GPUS];             /* when each GPU was (first) registered */
    unsigned char *done;                /* per event: delivered to this set */
    int ndone;
};
static struct nvmlEventSet_st *sets[MAX_SETS];
static pthread_mutex_t sets_lock = PTHREAD_MUTEX_INITIALIZER;

static int known_set(nvmlEventSet_t set) {
    for (int i = 0; i < MAX_SETS; i++)
        if (set && sets[i] == set) return set->magic == SET_MAGIC;
    return 0;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    READY();
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sets_lock);
    int slot = 0;
    while (slot < MAX_SETS && sets[slot]) slot++;
    struct nvmlEventSet_st *s = slot < MAX_SETS ? calloc(1, sizeof *s) : NULL;
    if (s) {
        s->done = calloc((size_t)(nevents ? nevents : 1), 1);
        if (!s->done) { free(s); s = NULL; }
    }
    if (!s) {
        pthread_mutex_unlock(&sets_lock);
        say("nvmlEventSetCreate: more than %d event sets, or out of memory", MAX_SETS);
        return NVML_ERROR_UNKNOWN;
    }
    s->magic = SET_MAGIC;
    s->ndone = nevents;
    sets[slot] = s;
    pthread_mutex_unlock(&sets_lock);
    *set = s;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    READY();
    pthread_mutex_lock(&sets_lock);
    int found = -1;
    for (int i = 0; i < MAX_SETS; i++)
        if (set && sets[i] == set) found = i;
    if (found >= 0) {
        sets[found] = NULL;
        set->magic = 0;
        free(set->done);
        free(set);
    }
    pthread_mutex_unlock(&sets_lock);
    return found >= 0 ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    DEV(d);
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED; /* no per-instance events (nvml.h) */
    *types = supported_types(d);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    DEV(d);
    if (types & ~(unsigned long long)nvmlEventTypeAll) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    /* some requested type not supported: none is registered */
    if (types & ~supported_types(d)) return NVML_ERROR_NOT_SUPPORTED;
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&sets_lock);
    if (!known_set(set)) r = NVML_ERROR_INVALID_ARGUMENT;
    else {
        if (!set->types[d->index]) set->since[d->index] = replay_now();
        set->types[d->index] |= types;
    }
    pthread_mutex_unlock(&sets_lock);
    return r;
}

/* The next event for ``set`` due by ``now`` (its index), -1 if none; ``*next`` the time of the
 * first one due later (or a huge number). Called with sets_lock held. */
static int due_event(nvmlEventSet_t set, double now, double *next) {
    *next = 1e300;
    for (int i = 0; i < nevents && i < set->ndone; i++) {
        const struct replay_event *e = &events[i];
        unsigned long long reg = set->types[e->gpu];
        if (set->done[i] || !reg || e->at < set->since[e->gpu]) continue;
        /* a GPU falling off the bus reaches every set that registered it: as its event type, or
         * (not registered for it, an older driver) as GPU_IS_LOST from the wait */
        if (!(reg & e->type) && e->type != nvmlEventTypeGpuUnavailableError) continue;
        if (e->at <= now) return i;
        if (e->at < *next) *next = e->at;
    }
    return -1;
}

/* Wait for the next event; ``fill`` writes it in the caller's layout. */
static nvmlReturn_t wait_event(nvmlEventSet_t set, unsigned int timeout_ms, const struct replay_event **out) {
    READY();
    double start = replay_now(), limit = timeout_ms / 1000.0;
    for (;;) {
        double now = replay_now(), next;
        pthread_mutex_lock(&sets_lock);
        if (!known_set(set)) {
            pthread_mutex_unlock(&sets_lock);
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        int i = due_event(set, now, &next);
        if (i >= 0) {
            set->done[i] = 1;
            *out = &events[i];
            int lost = !(set->types[events[i].gpu] & events[i].type);
            pthread_mutex_unlock(&sets_lock);
            return lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
        }
        pthread_mutex_unlock(&sets_lock);
        double left = start + limit - now;
        if (left <= 0) return NVML_ERROR_TIMEOUT;
        /* sleep until the next event or the timeout, at most 50 ms at a time (the clock may move) */
        double nap = next - now < left ? next - now : left;
        if (nap > 0.05) nap = 0.05;
        if (nap < 0.001) nap = 0.001;
        struct timespec ts = {0, (long)(nap * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* R450 on: nvmlEventData_t with the GPU- and compute-instance ids (0xFFFFFFFF: the whole GPU) */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    const struct replay_event *e = NULL;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = wait_event(set, timeout_ms, &e);
    if (r != NVML_SUCCESS) return r;
    memset(data, 0, sizeof *data);
    data->device = &gpus[e->gpu];
    data->eventType = e->type;
    data->eventData = e->type == nvmlEventTypeXidCriticalError ? e->data : 0; /* 0 for any other (nvml.h) */
    data->gpuInstanceId = e->mig < 0 ? 0xFFFFFFFFu : (unsigned)gpus[e->gpu].mig[e->mig]->gi;
    data->computeInstanceId = e->mig < 0 ? 0xFFFFFFFFu : (unsigned)gpus[e->gpu].mig[e->mig]->ci;
    return NVML_SUCCESS;
}

/* Before R450: the 24-byte struct without instance ids (what a driver exporting no _v2 writes) */
struct event_data_v1 { nvmlDevice_t device; unsigned long long eventType, eventData; };
_Static_assert(sizeof(struct event_data_v1) == 24, "pre-R450 nvmlEventData_t");
_Static_assert(sizeof(nvmlEventData_t) == 32, "R450 nvmlEventData_t");

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    const struct replay_event *e = NULL;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = wait_event(set, timeout_ms, &e);
    if (r != NVML_SUCCESS) return r;
    struct event_data_v1 *v1 = (struct event_data_v1 *)(void *)data;
    memset(v1, 0, sizeof *v1);
    v1->device = &gpus[e->gpu];
    v1->eventType = e->type;
    v1->eventData = e->type == nvmlEventTypeXidCriticalError ? e->data : 0;
    return NVML_SUCCESS;
}
