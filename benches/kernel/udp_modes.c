/* udp_modes: what the kernel's UDP path costs a RoCEv2 sender, by socket
 * mode: UDP ping-pong latency over loopback between two processes, busy
 * polling, for IPv4 and IPv6, with connected sockets (send/recv: the raw
 * floor of ../shared/anchors/udp_pingpong) and with unconnected ones
 * (sendto/recvfrom: what a RoCEv2 sender over IPv4 must use, since a
 * connected IPv4 socket numbers the IP identification field, which the
 * ICRC covers and the receiver cannot see).
 * usage: udp_modes [iters=200000] [cpu_parent=1] [cpu_child=0]
 * Output, one line per mode (one-way = RTT / 2):
 *   udp_mode family=4|6 socket=connected|unconnected size=24 p50_oneway_us=..
 */
/* now_ns, pin_cpu and pctl from the anchors' common.h (built with
 * -I ../shared/anchors, as run_cross.sh does). */
#include "common.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* The datagram of an 8-byte RC SEND ONLY: BTH 12 + payload 8 + ICRC 4. */
enum { SIZE = 24 };

struct end {
    int fd;
    struct sockaddr_storage addr;
    socklen_t len;
};

/* A socket bound to an ephemeral loopback port, DF set for IPv4 as ours. */
static int open_end(struct end *e, int v6) {
    memset(e, 0, sizeof(*e));
    e->fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM, 0);
    if (e->fd < 0) return -1;
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&e->addr;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        e->len = sizeof(*a);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&e->addr;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        e->len = sizeof(*a);
        int v = IP_PMTUDISC_DO;
        setsockopt(e->fd, IPPROTO_IP, IP_MTU_DISCOVER, &v, sizeof(v));
    }
    if (bind(e->fd, (struct sockaddr *)&e->addr, e->len) < 0) return -1;
    socklen_t l = e->len;
    return getsockname(e->fd, (struct sockaddr *)&e->addr, &l);
}

static void tx(const struct end *self, const struct end *peer, int conn, const char *buf, size_t n) {
    ssize_t r = conn ? send(self->fd, buf, n, 0)
                     : sendto(self->fd, buf, n, 0, (const struct sockaddr *)&peer->addr, peer->len);
    if (r < 0) { perror("send"); _exit(3); }
}

static ssize_t rx(const struct end *self, int conn, char *buf, size_t n, uint64_t deadline) {
    struct sockaddr_storage from;
    for (uint64_t spins = 1;; spins++) {
        socklen_t fl = sizeof(from);
        ssize_t r = conn ? recv(self->fd, buf, n, MSG_DONTWAIT)
                         : recvfrom(self->fd, buf, n, MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
        if (r >= 0) return r;
        if ((spins & 1023) == 0 && now_ns() > deadline) { fprintf(stderr, "poll timeout\n"); _exit(3); }
    }
}

/* One mode: p50 of the one-way time in microseconds, or -1. */
static double run(int v6, int conn, long iters, int cpu_p, int cpu_c) {
    struct end a, b;
    if (open_end(&a, v6) < 0 || open_end(&b, v6) < 0) return -1;
    if (conn && (connect(a.fd, (struct sockaddr *)&b.addr, b.len) < 0 ||
                 connect(b.fd, (struct sockaddr *)&a.addr, a.len) < 0))
        return -1;
    long warm = iters / 10 + 100;
    uint64_t deadline = now_ns() + 30ull * 1000000000ull;
    char buf[256] = {0};
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        pin_cpu(cpu_c);
        for (long i = 0; i < warm + iters; i++) {
            ssize_t r = rx(&b, conn, buf, sizeof(buf), deadline);
            tx(&b, &a, conn, buf, (size_t)r);
        }
        _exit(0);
    }
    pin_cpu(cpu_p);
    uint64_t *rtt = malloc(sizeof(uint64_t) * (size_t)iters);
    for (long i = 0; i < warm + iters; i++) {
        uint64_t t0 = now_ns();
        tx(&a, &b, conn, buf, SIZE);
        rx(&a, conn, buf, sizeof(buf), deadline);
        if (i >= warm) rtt[i - warm] = now_ns() - t0;
    }
    waitpid(pid, NULL, 0);
    close(a.fd);
    close(b.fd);
    double p50 = (double)pctl(rtt, (size_t)iters, 0.5) / 2000.0;
    free(rtt);
    return p50;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 200000;
    int cpu_p = argc > 2 ? atoi(argv[2]) : 1;
    int cpu_c = argc > 3 ? atoi(argv[3]) : 0;
    for (int v6 = 0; v6 < 2; v6++) {
        for (int conn = 1; conn >= 0; conn--) {
            double p50 = run(v6, conn, iters, cpu_p, cpu_c);
            if (p50 < 0) {
                printf("udp_mode family=%d socket=%s skipped (no %s loopback)\n", v6 ? 6 : 4,
                       conn ? "connected" : "unconnected", v6 ? "IPv6" : "IPv4");
                continue;
            }
            printf("udp_mode family=%d socket=%s size=%d p50_oneway_us=%.3f\n", v6 ? 6 : 4,
                   conn ? "connected" : "unconnected", SIZE, p50);
        }
    }
    return 0;
}
