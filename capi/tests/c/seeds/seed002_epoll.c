/* From seed 002_5320aa7a35179c5f.txt ("【C语言】RDMACM、Verbs API与epoll一起使用的示例"): its main is
 * kept, call for call and in its order: rdma_create_event_channel; ibv_create_cq; the CM
 * channel's fd and the CQ's channel fd (cq->channel->fd); epoll_create1; epoll_ctl(ADD) of both
 * with EPOLLIN | EPOLLET; a while (1) epoll_wait loop that, for the CM fd, gets an event, calls
 * handle_cm_event and rdma_ack_cm_event, and for the CQ fd polls the CQ into handle_cq_event;
 * then close(epoll_fd), ibv_destroy_cq, rdma_destroy_event_channel. So are its struct connection
 * and its two handlers, whose bodies ("处理RDMACM事件的逻辑", "处理完成队列事件的逻辑") the seed
 * leaves empty.
 *
 * Completed ("实际使用时可能需要根据具体需求进行更多的处理和错误检查"):
 *  - the seed's ibv_create_cq(NULL, 10, NULL, NULL, 0) has neither a device nor a completion
 *    channel (so cq->channel->fd would crash): the CQ is created on the first device
 *    rdma_get_devices returns, with a completion channel, armed with ibv_req_notify_cq;
 *  - rdma_event_channel_fd() does not exist in librdmacm: the fd is cm_channel->fd; and
 *    rdma_get_cm_event(channel, &event) returns int: the call is written as librdmacm declares it;
 *  - EPOLLET reports a change of state only, so both fds are made non-blocking (the seed includes
 *    <fcntl.h> and never uses it) and drained on each wake-up: CM events until EAGAIN; CQ events
 *    with ibv_get_cq_event / ibv_ack_cq_events / ibv_req_notify_cq (without them the channel is
 *    never read and never re-armed) before the seed's ibv_poll_cq loop;
 *  - the connection itself, started just before the loop: a server (rdma_create_id,
 *    rdma_bind_addr, rdma_listen) or a client (rdma_create_id, rdma_resolve_addr) on the first
 *    device's IPv4 address (its IPv4-mapped GID) and the given port; handle_cm_event resolves the
 *    route, creates the QP on the CQ (rdma_create_qp), registers memory, posts the receive and
 *    accepts or connects; a refused client (nobody listens yet) exits with status 75 (a
 *    receive flushed before the connection is established is left to that CM event);
 *  - the data and its check: the client SENDs MSG_SIZE bytes of one pattern, the server checks
 *    them and SENDs back MSG_SIZE bytes of another, which the client checks; the server
 *    disconnects once its reply's completion is in and ESTABLISHED was reported; each side leaves the loop when it is
 *    disconnected and has seen every completion it expects (the seed loops forever);
 *  - cleanup of what the completion added (QP, MRs, ids, PD, completion channel, device list).
 *
 * Usage: seed002_epoll server PORT
 *        seed002_epoll client PORT      (both on the first device's address)
 * Prints "seed002 server: OK" / "seed002 client: OK" and exits 0, or exits non-zero. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <rdma/rdma_cma.h>
/* completed */
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#define MAX_EVENTS 10

struct connection {
  struct rdma_cm_id *id;
  struct ibv_qp *qp;
  // 其他连接相关的数据
  struct ibv_mr *recv_mr;
  struct ibv_mr *send_mr;
  char *recv_buf;
  char *send_buf;
};

/* completed: the program's state */
#define MSG_SIZE 10000
static int server;
static const char *who;
static struct ibv_context *verbs;
static struct ibv_pd *pd;
static struct ibv_comp_channel *comp_channel;
static struct ibv_cq *cq;
static struct connection *conn;
static int sent, received, disconnected, established, disconnecting;

static void fail(const char *what)
{
  fprintf(stderr, "%s: %s (errno %d: %s)\n", who, what, errno, strerror(errno));
  exit(1);
}

static unsigned char pattern(int which, int i)
{
  return (unsigned char)(i * 13 + which * 101 + (i >> 9));
}

/* completed: the QP, memory and receive of a connection, on the CQ made in main */
static struct connection *build_connection(struct rdma_cm_id *id)
{
  struct ibv_qp_init_attr qp_attr;
  struct connection *c = calloc(1, sizeof(*c));

  if (id->verbs != verbs)
    fail("the id is on another device than the CQ (rdma_get_devices()[0])");
  memset(&qp_attr, 0, sizeof(qp_attr));
  qp_attr.send_cq = cq;
  qp_attr.recv_cq = cq;
  qp_attr.qp_type = IBV_QPT_RC;
  qp_attr.cap.max_send_wr = 4;
  qp_attr.cap.max_recv_wr = 4;
  qp_attr.cap.max_send_sge = 1;
  qp_attr.cap.max_recv_sge = 1;
  if (!c || rdma_create_qp(id, pd, &qp_attr))
    fail("rdma_create_qp");
  c->id = id;
  c->qp = id->qp;
  id->context = c;
  c->recv_buf = calloc(1, MSG_SIZE);
  c->send_buf = calloc(1, MSG_SIZE);
  if (!c->recv_buf || !c->send_buf)
    fail("out of memory");
  c->recv_mr = ibv_reg_mr(pd, c->recv_buf, MSG_SIZE, IBV_ACCESS_LOCAL_WRITE);
  c->send_mr = ibv_reg_mr(pd, c->send_buf, MSG_SIZE, 0);
  if (!c->recv_mr || !c->send_mr)
    fail("ibv_reg_mr");

  struct ibv_sge sge = {.addr = (uintptr_t)c->recv_buf, .length = MSG_SIZE,
                        .lkey = c->recv_mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = (uintptr_t)c, .sg_list = &sge, .num_sge = 1}, *bad;
  if (ibv_post_recv(c->qp, &wr, &bad))
    fail("ibv_post_recv");
  return c;
}

/* completed: the server disconnects once its reply is complete and the connection has been
 * reported established (a DREQ cannot be sent before: the first packets of a connection may
 * arrive, and complete, before the RTU does) */
static void maybe_disconnect(void)
{
  if (server && sent && established && !disconnecting) {
    disconnecting = 1;
    if (rdma_disconnect(conn->id))
      fail("rdma_disconnect");
  }
}

/* completed: SEND the buffer filled with pattern `which` */
static void send_pattern(struct connection *c, int which)
{
  for (int i = 0; i < MSG_SIZE; i++)
    c->send_buf[i] = (char)pattern(which, i);
  struct ibv_sge sge = {.addr = (uintptr_t)c->send_buf, .length = MSG_SIZE,
                        .lkey = c->send_mr->lkey};
  struct ibv_send_wr wr = {.wr_id = (uintptr_t)c, .sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED},
                     *bad;
  if (ibv_post_send(c->qp, &wr, &bad))
    fail("ibv_post_send");
}

void handle_cm_event(struct rdma_cm_event *event) {
  // 处理RDMACM事件的逻辑 (completed)
  struct rdma_conn_param param;

  printf("%s: %s\n", who, rdma_event_str(event->event));
  memset(&param, 0, sizeof(param));
  param.responder_resources = 1;
  param.initiator_depth = 1;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  switch (event->event) {
  case RDMA_CM_EVENT_ADDR_RESOLVED:
    if (rdma_resolve_route(event->id, 2000))
      fail("rdma_resolve_route");
    break;
  case RDMA_CM_EVENT_ROUTE_RESOLVED:
    conn = build_connection(event->id);
    if (rdma_connect(event->id, &param))
      fail("rdma_connect");
    break;
  case RDMA_CM_EVENT_CONNECT_REQUEST:
    if (conn) { /* one client at a time */
      rdma_reject(event->id, NULL, 0);
      break;
    }
    conn = build_connection(event->id);
    if (rdma_accept(event->id, &param))
      fail("rdma_accept");
    break;
  case RDMA_CM_EVENT_ESTABLISHED:
    established = 1;
    if (!server)
      send_pattern(conn, 1);
    maybe_disconnect();
    break;
  case RDMA_CM_EVENT_DISCONNECTED:
    disconnected = 1;
    break;
  case RDMA_CM_EVENT_REJECTED:
  case RDMA_CM_EVENT_UNREACHABLE:
  case RDMA_CM_EVENT_CONNECT_ERROR:
    if (!server) {
      fprintf(stderr, "%s: %s (status %d): server not listening\n", who,
              rdma_event_str(event->event), event->status);
      exit(75);
    }
    /* fall through */
  default:
    fprintf(stderr, "%s: unexpected %s (status %d)\n", who, rdma_event_str(event->event),
            event->status);
    exit(1);
  }
}

void handle_cq_event(struct ibv_wc *wc) {
  // 处理完成队列事件的逻辑 (completed)
  struct connection *c = (struct connection *)(uintptr_t)wc->wr_id;

  if (wc->status != IBV_WC_SUCCESS) {
    /* A receive flushed because the connection attempt failed (librdmacm moves the QP to the
     * error state on REJECTED): the CM event says why. */
    if (wc->status == IBV_WC_WR_FLUSH_ERR && !established)
      return;
    fprintf(stderr, "%s: completion status %s\n", who, ibv_wc_status_str(wc->status));
    exit(1);
  }
  if (wc->opcode == IBV_WC_RECV) {
    int which = server ? 1 : 2;
    if (wc->byte_len != MSG_SIZE) {
      fprintf(stderr, "%s: received %u bytes, sent %d\n", who, wc->byte_len, MSG_SIZE);
      exit(1);
    }
    for (int i = 0; i < MSG_SIZE; i++)
      if ((unsigned char)c->recv_buf[i] != pattern(which, i)) {
        fprintf(stderr, "%s: byte %d is %#x, sent %#x\n", who, i,
                (unsigned char)c->recv_buf[i], pattern(which, i));
        exit(1);
      }
    printf("%s: received %d bytes, all as sent\n", who, MSG_SIZE);
    received = 1;
    if (server)
      send_pattern(c, 2);
  } else if (wc->opcode == IBV_WC_SEND) {
    printf("%s: send completed\n", who);
    sent = 1;
    maybe_disconnect();
  } else {
    fprintf(stderr, "%s: unexpected completion opcode %d\n", who, wc->opcode);
    exit(1);
  }
}

/* completed: the IPv4 address of the device's first IPv4-mapped GID */
static void device_address(struct ibv_context *ctx, struct sockaddr_in *sin)
{
  struct ibv_port_attr pa;
  static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

  if (ibv_query_port(ctx, 1, &pa))
    fail("ibv_query_port");
  for (int i = 0; i < pa.gid_tbl_len; i++) {
    union ibv_gid g;
    if (ibv_query_gid(ctx, 1, i, &g))
      break;
    if (memcmp(g.raw, v4mapped, sizeof(v4mapped)) == 0) {
      memcpy(&sin->sin_addr, g.raw + 12, 4);
      return;
    }
  }
  errno = EADDRNOTAVAIL;
  fail("the first device has no IPv4 address");
}

static void set_nonblocking(int fd)
{
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    fail("fcntl O_NONBLOCK");
}

int main(int argc, char **argv) {
  struct rdma_event_channel *cm_channel;
  struct rdma_cm_event *event;
  struct epoll_event epoll_events[MAX_EVENTS];
  struct ibv_wc wc;
  int cm_fd, cq_fd, epoll_fd, i, n;
  /* completed */
  struct ibv_context **devices;
  struct rdma_cm_id *listener = NULL, *id = NULL;
  struct sockaddr_in addr;
  char text[INET_ADDRSTRLEN];

  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 3 && strcmp(argv[1], "server") == 0)
    server = 1;
  else if (argc == 3 && strcmp(argv[1], "client") == 0)
    server = 0;
  else {
    fprintf(stderr, "usage: %s server|client PORT\n", argv[0]);
    return 2;
  }
  who = server ? "seed002 server" : "seed002 client";

  // 创建RDMACM事件通知文件描述符
  cm_channel = rdma_create_event_channel();
  if (!cm_channel) {
    perror("Failed to create RDMACM event channel");
    return 1;
  }

  // 创建完成队列(CQ)
  /* completed: a device and a completion channel for the CQ */
  devices = rdma_get_devices(&n);
  if (!devices || n < 1) {
    perror("No RDMA device (rdma_get_devices)");
    return 1;
  }
  verbs = devices[0];
  pd = ibv_alloc_pd(verbs);
  comp_channel = pd ? ibv_create_comp_channel(verbs) : NULL;
  if (!comp_channel) {
    perror("Failed to create a PD and completion channel");
    return 1;
  }
  cq = ibv_create_cq(verbs, 10, NULL, comp_channel, 0);
  if (!cq) {
    perror("Failed to create completion queue");
    return 1;
  }
  if (ibv_req_notify_cq(cq, 0)) { /* completed */
    perror("ibv_req_notify_cq");
    return 1;
  }

  // 获取RDMACM事件通知文件描述符和完成队列的文件描述符
  cm_fd = cm_channel->fd;
  cq_fd = cq->channel->fd;
  set_nonblocking(cm_fd); /* completed */
  set_nonblocking(cq_fd);

  // 创建epoll实例
  epoll_fd = epoll_create1(0);
  if (epoll_fd == -1) {
    perror("Failed to create epoll instance");
    return 1;
  }

  // 将RDMACM事件通知文件描述符添加到epoll的事件集合中
  struct epoll_event cm_event;
  cm_event.events = EPOLLIN | EPOLLET;
  cm_event.data.fd = cm_fd;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, cm_fd, &cm_event) == -1) {
    perror("Failed to add RDMACM event channel to epoll");
    return 1;
  }

  // 将完成队列的文件描述符添加到epoll的事件集合中
  struct epoll_event cq_event;
  cq_event.events = EPOLLIN | EPOLLET;
  cq_event.data.fd = cq_fd;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, cq_fd, &cq_event) == -1) {
    perror("Failed to add completion queue to epoll");
    return 1;
  }

  /* completed: start the connection */
  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)atoi(argv[2]));
  device_address(verbs, &addr);
  inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  if (server) {
    if (rdma_create_id(cm_channel, &listener, NULL, RDMA_PS_TCP))
      fail("rdma_create_id");
    if (rdma_bind_addr(listener, (struct sockaddr *)&addr))
      fail("rdma_bind_addr");
    if (rdma_listen(listener, 1))
      fail("rdma_listen");
    printf("%s: listening on %s:%s\n", who, text, argv[2]);
  } else {
    if (rdma_create_id(cm_channel, &id, NULL, RDMA_PS_TCP))
      fail("rdma_create_id");
    if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000))
      fail("rdma_resolve_addr");
    printf("%s: connecting to %s:%s\n", who, text, argv[2]);
  }

  // 进入事件循环
  /* completed: until disconnected, with the completions this side expects */
  while (!(disconnected && sent && received)) {
    // 等待事件发生
    n = epoll_wait(epoll_fd, epoll_events, MAX_EVENTS, -1);
    if (n == -1) {
      if (errno == EINTR) /* completed */
        continue;
      perror("Failed to wait for events");
      return 1;
    }

    // 处理所有事件
    for (i = 0; i < n; i++) {
      if (epoll_events[i].data.fd == cm_fd) {
        // 有RDMACM事件发生
        /* completed: every queued event (edge-triggered), until EAGAIN */
        while (rdma_get_cm_event(cm_channel, &event) == 0) {
          handle_cm_event(event);
          rdma_ack_cm_event(event);
        }
        if (errno != EAGAIN)
          fail("rdma_get_cm_event");
      } else if (epoll_events[i].data.fd == cq_fd) {
        // 有完成队列事件发生
        /* completed: read and acknowledge the channel's events, re-arm, then poll */
        struct ibv_cq *ev_cq;
        void *ev_ctx;
        while (ibv_get_cq_event(comp_channel, &ev_cq, &ev_ctx) == 0) {
          ibv_ack_cq_events(ev_cq, 1);
          if (ibv_req_notify_cq(ev_cq, 0))
            fail("ibv_req_notify_cq");
        }
        if (errno != EAGAIN)
          fail("ibv_get_cq_event");
        while (ibv_poll_cq(cq, 1, &wc) > 0) {
          handle_cq_event(&wc);
        }
      }
    }
  }

  /* completed: the connection's resources */
  rdma_destroy_qp(conn->id);
  if (ibv_dereg_mr(conn->recv_mr) || ibv_dereg_mr(conn->send_mr))
    fail("ibv_dereg_mr");
  if (rdma_destroy_id(conn->id))
    fail("rdma_destroy_id");
  if (listener && rdma_destroy_id(listener))
    fail("rdma_destroy_id (listener)");

  // 清理资源
  close(epoll_fd);
  if (ibv_destroy_cq(cq))
    fail("ibv_destroy_cq");
  if (ibv_destroy_comp_channel(comp_channel) || ibv_dealloc_pd(pd)) /* completed */
    fail("ibv_destroy_comp_channel / ibv_dealloc_pd");
  rdma_free_devices(devices);
  rdma_destroy_event_channel(cm_channel);

  printf("%s: OK\n", who);
  return 0;
}
