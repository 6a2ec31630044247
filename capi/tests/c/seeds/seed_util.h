/* Not from a seed: the pieces the plain-verbs seeds (000, 003, 004) leave out and every real
 * program needs, shared so that each seed file stays close to its seed.
 *
 *  - an out-of-band exchange over TCP (the server listens on PORT, the client connects to
 *    HOST:PORT): each side sends its QP number, PSN, GID and, where it has one, the address and
 *    rkey of the memory it exposes;
 *  - the QP state changes RESET -> INIT -> RTR -> RTS for an RC QP (the seeds create the QP and
 *    post to it, but never connect it);
 *  - the GID: the first IPv4-mapped entry (::ffff:a.b.c.d) of port 1, as RoCE v2 uses, else 0;
 *  - a one-byte exchange over the same socket, so that neither side tears its QP down while the
 *    other still waits for an acknowledgement from it.
 *
 * A client that finds no server listening exits with SEED_RETRY (75, EX_TEMPFAIL) so that a test
 * that starts both at once can try again; every other failure exits 1. */
#ifndef SEED_UTIL_H
#define SEED_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define SEED_RETRY 75
#define SEED_IB_PORT 1

/* What each side tells the other. */
struct seed_peer {
  uint32_t qpn;
  uint32_t psn;
  union ibv_gid gid;
  uint64_t addr; /* 0 if the side exposes no memory */
  uint32_t rkey;
};

static inline void __attribute__((noreturn, format(printf, 1, 2)))
seed_fail(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  fputs("FAIL: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static inline void seed_write_all(int fd, const void *buf, size_t len)
{
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      seed_fail("write to the peer: %s", n < 0 ? strerror(errno) : "closed");
    p += n;
    len -= (size_t)n;
  }
}

/* Reads exactly len bytes; returns 0 if the peer closed before the first byte. */
static inline int seed_read_all(int fd, void *buf, size_t len)
{
  char *p = buf;
  size_t got = 0;
  while (got < len) {
    ssize_t n = read(fd, p + got, len - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      seed_fail("read from the peer: %s", strerror(errno));
    if (n == 0) {
      if (got == 0)
        return 0;
      seed_fail("the peer closed the connection mid-message");
    }
    got += (size_t)n;
  }
  return 1;
}

/* Server: listen on port (all addresses), accept one client, return its socket. */
static inline int seed_tcp_serve(int port)
{
  struct sockaddr_in a;
  int one = 1;
  int l = socket(AF_INET, SOCK_STREAM, 0);
  if (l < 0)
    seed_fail("socket: %s", strerror(errno));
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons((uint16_t)port);
  if (bind(l, (struct sockaddr *)&a, sizeof(a)))
    seed_fail("bind to TCP port %d: %s", port, strerror(errno));
  if (listen(l, 1))
    seed_fail("listen: %s", strerror(errno));
  int fd = accept(l, NULL, NULL);
  if (fd < 0)
    seed_fail("accept: %s", strerror(errno));
  close(l);
  return fd;
}

/* Client: connect to host:port; no server there yet exits SEED_RETRY. */
static inline int seed_tcp_reach(const char *host, const char *port)
{
  struct addrinfo hints, *res, *r;
  int err, fd = -1, refused = 0;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  err = getaddrinfo(host, port, &hints, &res);
  if (err)
    seed_fail("getaddrinfo %s:%s: %s", host, port, gai_strerror(err));
  for (r = res; r; r = r->ai_next) {
    fd = socket(r->ai_family, r->ai_socktype, r->ai_protocol);
    if (fd < 0)
      continue;
    if (connect(fd, r->ai_addr, r->ai_addrlen) == 0)
      break;
    if (errno == ECONNREFUSED)
      refused = 1;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0 && refused) {
    fprintf(stderr, "server not listening on %s:%s yet\n", host, port);
    exit(SEED_RETRY);
  }
  if (fd < 0)
    seed_fail("cannot connect to %s:%s", host, port);
  return fd;
}

static inline void seed_send_peer(int fd, const struct seed_peer *p)
{
  char msg[128];
  char gid[33];
  memset(msg, 0, sizeof(msg));
  for (int i = 0; i < 16; i++)
    sprintf(gid + 2 * i, "%02x", p->gid.raw[i]);
  snprintf(msg, sizeof(msg), "%08" PRIx32 ":%08" PRIx32 ":%s:%016" PRIx64 ":%08" PRIx32, p->qpn,
           p->psn, gid, p->addr, p->rkey);
  seed_write_all(fd, msg, sizeof(msg));
}

static inline void seed_recv_peer(int fd, struct seed_peer *p)
{
  char msg[128];
  char gid[33];
  if (!seed_read_all(fd, msg, sizeof(msg)))
    seed_fail("the peer closed the connection before sending its QP");
  msg[sizeof(msg) - 1] = 0;
  if (sscanf(msg, "%8" SCNx32 ":%8" SCNx32 ":%32[0-9a-f]:%16" SCNx64 ":%8" SCNx32, &p->qpn,
             &p->psn, gid, &p->addr, &p->rkey) != 5 ||
      strlen(gid) != 32)
    seed_fail("malformed peer message %.80s", msg);
  for (int i = 0; i < 16; i++) {
    unsigned v;
    sscanf(gid + 2 * i, "%2x", &v);
    p->gid.raw[i] = (uint8_t)v;
  }
}

/* Sends one byte and returns the peer's. */
static inline char seed_sync(int fd, char mine)
{
  char theirs;
  seed_write_all(fd, &mine, 1);
  if (!seed_read_all(fd, &theirs, 1))
    seed_fail("the peer closed the connection before the final exchange");
  return theirs;
}

/* The first IPv4-mapped GID of the port (what RoCE v2 over IPv4 uses), else index 0. */
static inline int seed_gid(struct ibv_context *ctx, union ibv_gid *gid)
{
  struct ibv_port_attr pa;
  static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (ibv_query_port(ctx, SEED_IB_PORT, &pa))
    seed_fail("ibv_query_port: %s", strerror(errno));
  for (int i = 0; i < pa.gid_tbl_len; i++) {
    union ibv_gid g;
    if (ibv_query_gid(ctx, SEED_IB_PORT, i, &g))
      break;
    if (memcmp(g.raw, v4mapped, sizeof(v4mapped)) == 0) {
      *gid = g;
      return i;
    }
  }
  if (ibv_query_gid(ctx, SEED_IB_PORT, 0, gid))
    seed_fail("ibv_query_gid: %s", strerror(errno));
  return 0;
}

static inline enum ibv_mtu seed_mtu(struct ibv_context *ctx)
{
  struct ibv_port_attr pa;
  if (ibv_query_port(ctx, SEED_IB_PORT, &pa))
    seed_fail("ibv_query_port: %s", strerror(errno));
  return pa.active_mtu;
}

/* RESET -> INIT, with the remote access the peer needs (0 if it only sends). */
static inline void seed_qp_init(struct ibv_qp *qp, int access)
{
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = SEED_IB_PORT;
  a.qp_access_flags = access;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    seed_fail("ibv_modify_qp to INIT: %s", strerror(errno));
}

/* INIT -> RTR -> RTS toward the peer, one READ/atomic outstanding each way. */
static inline void seed_qp_connect(struct ibv_qp *qp, struct ibv_context *ctx, int sgid_index,
                                   uint32_t my_psn, const struct seed_peer *remote)
{
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = seed_mtu(ctx);
  a.dest_qp_num = remote->qpn;
  a.rq_psn = remote->psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = SEED_IB_PORT;
  a.ah_attr.grh.dgid = remote->gid;
  a.ah_attr.grh.sgid_index = (uint8_t)sgid_index;
  a.ah_attr.grh.hop_limit = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    seed_fail("ibv_modify_qp to RTR: %s", strerror(errno));
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = my_psn;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    seed_fail("ibv_modify_qp to RTS: %s", strerror(errno));
}

/* Busy-polls cq for one completion (yielding the CPU between empty polls). */
static inline void seed_poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
  for (;;) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0)
      seed_fail("ibv_poll_cq: %d", n);
    if (n == 1)
      return;
    sched_yield();
  }
}

/* A PSN of 24 bits that differs from run to run. */
static inline uint32_t seed_psn(void)
{
  return ((uint32_t)getpid() * 2654435761u) & 0xffffff;
}

#endif
