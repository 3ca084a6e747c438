/* gpuslurm-hook-client: the hook server's client without a Python start (`gpuslurm install
 * --c-client` builds it with the node's C compiler; docs/hooks.md, "The hook server").
 *
 *     gpuslurm-hook-client HOOK FALLBACK...
 *
 * The same protocol and the same rule as gpuslurm/slurm/hookclient.py, which is the reference:
 * until the server's fork says READY and this client answers GO (with the hook's streams), any
 * failure (no socket, nobody listening, a peer that is not root, an environment that cannot be
 * sent, the connection closed, no READY within 10 s) execs FALLBACK, the hook itself in Python,
 * as install writes it; after GO, no exit code back fails the hook closed (70, EXIT_INTERNAL).
 * Written in C because a Python start is most of what a served hook costs (benchmarks/README.md);
 * it links nothing but libc. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define MAGIC "gpuslurm-hook/1"
#define DEFAULT_SOCKET "/run/gpuslurm/hooks.sock"
#define MAX_REQUEST (256 * 1024)
#define EXIT_INTERNAL 70

extern char **environ;
static char request[MAX_REQUEST];

static int append(size_t *len, const char *item, size_t n, int separate) {
    if (*len + (separate ? 1 : 0) + n > MAX_REQUEST) return -1;
    if (separate) request[(*len)++] = '\0';
    memcpy(request + *len, item, n);
    *len += n;
    return 0;
}

/* Whether environ can be sent as parse_request takes it: NAME=VALUE, a name without '=' that is
 * not empty, no name twice (the Python client's dict cannot repeat one either). At most
 * MAX_ENTRIES entries (slurmd's hook environment has some fifty), so the check stays cheap. */
#define MAX_ENTRIES 4096
static int environment_ok(void) {
    size_t count = 0;
    for (char **e = environ; *e; e++)
        if (++count > MAX_ENTRIES) return 0;
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (eq == NULL || eq == *e) return 0;
        for (char **f = environ; f < e; f++)
            if (strncmp(*f, *e, (size_t)(eq - *e) + 1) == 0) return 0;
    }
    return 1;
}

/* The hook's exit code from the server, or -1 when nothing was sent (run FALLBACK), or
 * EXIT_INTERNAL when the request went and no exit code came back. */
static int ask(const char *hook, const char *path) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path || !environment_ok()) return -1;
    strcpy(addr.sun_path, path);
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0) return -1;
    if (sock <= 2) { /* a closed 0, 1 or 2: the socket would stand in for the hook's stream */
        close(sock);
        return -1;
    }
    struct timeval connect_timeout = {.tv_sec = 2};
    setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &connect_timeout, sizeof connect_timeout);
    struct ucred peer;
    socklen_t peer_len = sizeof peer;
    if (connect(sock, (struct sockaddr *)&addr, sizeof addr) != 0
        || getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0 || peer_len != sizeof peer) {
        close(sock);
        return -1;
    }
    if (peer.uid != 0) {
        fprintf(stderr, "gpuslurm %s: %s is not root's hook server; running the hook here\n", hook, path);
        close(sock);
        return -1;
    }
    mode_t mask = umask(077);
    umask(mask);
    char octal[8];
    int octal_len = snprintf(octal, sizeof octal, "%o", (unsigned)mask);
    size_t len = 0;
    if (append(&len, MAGIC, strlen(MAGIC), 0) || append(&len, hook, strlen(hook), 1)
        || append(&len, octal, (size_t)octal_len, 1)) {
        close(sock);
        return -1;
    }
    for (char **e = environ; *e; e++) {
        if (append(&len, *e, strlen(*e), 1)) {
            close(sock);
            return -1;
        }
    }
    if (send(sock, request, len, MSG_NOSIGNAL) != (ssize_t)len) {
        close(sock);
        return -1; /* a SOCK_SEQPACKET message goes whole or not at all */
    }
    /* The server's fork has the request whole (READY); only our GO lets it run the hook, so
     * without READY in time nothing runs there and the hook runs here. */
    struct timeval ready_timeout = {.tv_sec = 10};
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &ready_timeout, sizeof ready_timeout);
    char answer[64];
    ssize_t got;
    do {
        got = recv(sock, answer, sizeof answer, 0);
    } while (got < 0 && errno == EINTR);
    if (got != 5 || memcmp(answer, "ready", 5) != 0) {
        close(sock);
        return -1;
    }
    /* GO carries the hook's streams: a request left in a wedged server's queue holds none of
     * slurmd's descriptors (slurmd waits for the hook's output to end). */
    int fds[3] = {0, 1, 2};
    union {
        char buf[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct iovec iov = {.iov_base = "go", .iov_len = 2};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
    if (sendmsg(sock, &msg, MSG_NOSIGNAL) != 2) {
        close(sock);
        return -1; /* the fork never had GO: nothing ran there */
    }
    struct timeval no_timeout = {0}; /* slurmd's PrologEpilogTimeout bounds the hook, as before */
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &no_timeout, sizeof no_timeout);
    do {
        got = recv(sock, answer, sizeof answer - 1, 0);
    } while (got < 0 && errno == EINTR);
    close(sock);
    if (got >= 4 && got <= 6 && memcmp(answer, "rc ", 3) == 0) {
        int code = 0;
        for (ssize_t i = 3; i < got; i++) {
            if (answer[i] < '0' || answer[i] > '9') goto closed;
            code = code * 10 + (answer[i] - '0');
        }
        if (code <= 255) return code;
    }
closed:
    fprintf(stderr, "gpuslurm %s: the hook server took the request but gave no exit code; failing closed\n",
            hook);
    return EXIT_INTERNAL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: gpuslurm-hook-client prolog|epilog FALLBACK...\n");
        return 2;
    }
    const char *hook = argv[1];
    /* install writes `CLIENT HOOK PYTHON -I -S -c CODE HOOK "$@"`: served only when "$@" was
     * empty (anything else, such as --help, is the Python hook's to answer) */
    int served = (strcmp(hook, "prolog") == 0 || strcmp(hook, "epilog") == 0)
                 && argc == 8 && strcmp(argv[5], "-c") == 0 && strcmp(argv[7], hook) == 0;
    if (served) {
        const char *path = getenv("GPUSLURM_HOOK_SOCKET");
        int code = ask(hook, path && *path ? path : DEFAULT_SOCKET);
        if (code >= 0) return code;
    }
    execv(argv[2], argv + 2);
    fprintf(stderr, "gpuslurm %s: cannot run %s: %s\n", hook, argv[2], strerror(errno));
    return EXIT_INTERNAL;
}
