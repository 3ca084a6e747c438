/*
 * cgroup2_only.so: shows slurmd and slurmstepd a cgroup-v2-only host on this hybrid one. Tests only.
 *
 * Slurm's cgroup/v2 plugin reads /proc/<pid>/cgroup and refuses a host whose file lists v1
 * hierarchies ("Hybrid mode is not supported"). The test cluster (docker-slurm/cluster.sh,
 * GPUSLURM_SLURM_ROOT with cgroup v2) runs slurmd with this library in LD_PRELOAD, in a cgroup
 * namespace rooted at a cgroup of its own under the host's cgroup2 tree, which is bind-mounted at
 * the root's /sys/fs/cgroup. For slurmd and slurmstepd alone, an open of /proc/<pid>/cgroup
 * (self, thread-self or a number) gives a copy holding only the unified ("0::") line, as on a
 * host booted without v1; a path outside the namespace ("/.." for the host's init) reads as the
 * namespace's root, where a booted host's init sits.
 *
 * Every other program (the prolog, job tasks, anything slurmd runs) keeps the real file: the
 * library does nothing in them and removes itself from their LD_PRELOAD, so their children do
 * not load it either.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define LIB_NAME "cgroup2_only"
#define MAX_CGROUP_FILE 16384

static int filtering;

static const char *base_name(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash ? slash + 1 : path;
}

static int is_slurm_daemon(void)
{
	char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (n <= 0)
		return 0;
	exe[n] = '\0';
	/* Debian installs them as slurmd-wlm and slurmstepd-wlm behind links of the usual names. */
	return !strcmp(base_name(exe), "slurmd") || !strcmp(base_name(exe), "slurmstepd")
		|| !strcmp(base_name(exe), "slurmd-wlm") || !strcmp(base_name(exe), "slurmstepd-wlm");
}

/* LD_PRELOAD without the entries naming this library's file (separated by ':' or ' '). */
static void drop_from_ld_preload(void)
{
	const char *old = getenv("LD_PRELOAD"), *self;
	char *copy, *out, *entry, *save = NULL;
	size_t used = 0;
	Dl_info info;

	if (!old || !dladdr((void *)drop_from_ld_preload, &info) || !info.dli_fname)
		return;
	self = base_name(info.dli_fname);
	if (!strstr(old, self))
		return;
	copy = strdup(old);
	out = calloc(1, strlen(old) + 1);
	if (!copy || !out) {
		free(copy);
		free(out);
		unsetenv("LD_PRELOAD");
		return;
	}
	for (entry = strtok_r(copy, ": ", &save); entry; entry = strtok_r(NULL, ": ", &save)) {
		if (!strcmp(base_name(entry), self))
			continue;
		if (used)
			out[used++] = ':';
		strcpy(out + used, entry);
		used += strlen(entry);
	}
	if (used)
		setenv("LD_PRELOAD", out, 1);
	else
		unsetenv("LD_PRELOAD");
	free(copy);
	free(out);
}

__attribute__((constructor)) static void cgroup2_only_init(void)
{
	filtering = is_slurm_daemon();
	if (!filtering)
		drop_from_ld_preload();
}

/* /proc/self/cgroup, /proc/thread-self/cgroup or /proc/<digits>/cgroup. */
static int is_proc_cgroup(const char *path)
{
	const char *p;

	if (!path || strncmp(path, "/proc/", 6))
		return 0;
	p = path + 6;
	if (!strncmp(p, "self/", 5))
		p += 5;
	else if (!strncmp(p, "thread-self/", 12))
		p += 12;
	else {
		const char *digits = p;

		while (*p >= '0' && *p <= '9')
			p++;
		if (p == digits || *p != '/')
			return 0;
		p++;
	}
	return !strcmp(p, "cgroup");
}

typedef int (*open_fn)(const char *, int, ...);

/* A memfd holding the unified line of the real file; -1 with errno set on failure. */
static int unified_only(const char *path, int flags)
{
	static open_fn real_open;
	char buf[MAX_CGROUP_FILE + 1], out[MAX_CGROUP_FILE + 16];
	size_t len = 0, olen = 0;
	ssize_t n;
	char *line, *save = NULL;
	int fd, memfd;

	if (!real_open)
		real_open = (open_fn)dlsym(RTLD_NEXT, "open");
	fd = real_open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	while (len < MAX_CGROUP_FILE && (n = read(fd, buf + len, MAX_CGROUP_FILE - len)) > 0)
		len += (size_t)n;
	close(fd);
	buf[len] = '\0';
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, "0::", 3))
			continue;
		/* Outside the cgroup namespace: its root, as a booted host's init. */
		if (!strncmp(line + 3, "/..", 3))
			line = "0::/";
		olen = (size_t)snprintf(out, sizeof(out), "%s\n", line);
		break;
	}
	memfd = memfd_create(LIB_NAME, (flags & O_CLOEXEC) ? MFD_CLOEXEC : 0);
	if (memfd < 0)
		return -1;
	if (write(memfd, out, olen) != (ssize_t)olen || lseek(memfd, 0, SEEK_SET) != 0) {
		int saved = errno;

		close(memfd);
		errno = saved ? saved : EIO;
		return -1;
	}
	return memfd;
}

static int wanted(const char *path)
{
	return filtering && is_proc_cgroup(path);
}

#define REAL(name, type) \
	static type real_##name; \
	if (!real_##name) \
		real_##name = (type)dlsym(RTLD_NEXT, #name)

#define MODE_ARG(flags, mode) \
	do { \
		if ((flags) & (O_CREAT | __O_TMPFILE)) { \
			va_list ap; \
			va_start(ap, flags); \
			mode = va_arg(ap, mode_t); \
			va_end(ap); \
		} \
	} while (0)

int open(const char *path, int flags, ...)
{
	mode_t mode = 0;
	REAL(open, open_fn);

	MODE_ARG(flags, mode);
	if (wanted(path))
		return unified_only(path, flags);
	return real_open(path, flags, mode);
}

int open64(const char *path, int flags, ...)
{
	mode_t mode = 0;
	REAL(open64, open_fn);

	MODE_ARG(flags, mode);
	if (wanted(path))
		return unified_only(path, flags);
	return real_open64(path, flags, mode);
}

typedef int (*openat_fn)(int, const char *, int, ...);

int openat(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = 0;
	REAL(openat, openat_fn);

	MODE_ARG(flags, mode);
	if (wanted(path))
		return unified_only(path, flags);
	return real_openat(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = 0;
	REAL(openat64, openat_fn);

	MODE_ARG(flags, mode);
	if (wanted(path))
		return unified_only(path, flags);
	return real_openat64(dirfd, path, flags, mode);
}

/* _FORTIFY_SOURCE's checked opens. */
typedef int (*open2_fn)(const char *, int);

int __open_2(const char *path, int flags)
{
	REAL(__open_2, open2_fn);

	if (wanted(path))
		return unified_only(path, flags);
	return real___open_2(path, flags);
}

int __open64_2(const char *path, int flags)
{
	REAL(__open64_2, open2_fn);

	if (wanted(path))
		return unified_only(path, flags);
	return real___open64_2(path, flags);
}

typedef FILE *(*fopen_fn)(const char *, const char *);

static FILE *fopen_unified(const char *path, const char *mode)
{
	int fd = unified_only(path, strchr(mode, 'e') ? O_CLOEXEC : 0);
	FILE *file;

	if (fd < 0)
		return NULL;
	file = fdopen(fd, "r");
	if (!file)
		close(fd);
	return file;
}

FILE *fopen(const char *path, const char *mode)
{
	REAL(fopen, fopen_fn);

	if (wanted(path))
		return fopen_unified(path, mode);
	return real_fopen(path, mode);
}

FILE *fopen64(const char *path, const char *mode)
{
	REAL(fopen64, fopen_fn);

	if (wanted(path))
		return fopen_unified(path, mode);
	return real_fopen64(path, mode);
}
