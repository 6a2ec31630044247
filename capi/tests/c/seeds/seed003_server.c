/* From seed 003_278a4ec17b85a863.txt ("一文读懂RDMA", 四、RDMA的代码演示, 服务器端代码): "客户端向服务器
 * 发送一个消息,服务器接收到消息后回复一个确认". The seed's server is a skeleton whose steps are
 * comments ("省略初始化代码", "省略QP创建和配置代码", "省略接收代码", "省略发送代码", "省略清理代码")
 * around a while (1) loop that receives a message, prints "Received message: %s" and sends an
 * acknowledgement. Its structure and printf are kept; each elided step is completed with the verbs
 * the seed names in its closing paragraph ("设备查询、内存注册、队列对的创建和配置"):
 *  - 初始化RDMA设备和资源: the first device, ibv_query_device/ibv_query_port, a PD, a completion
 *    channel and CQ, two registered buffers (receive, send);
 *  - 创建并配置队列对: an RC QP taken to RTS after exchanging QP numbers and GIDs with the
 *    client over TCP (seed_util.h), a receive posted first;
 *  - 接收消息: wait on the completion channel for the receive, or for the client to close its TCP
 *    connection, which ends the loop (the seed's loop never ends; this server serves one client);
 *    the message must be "Hello, RDMA!" (NUL included) or the server fails;
 *  - 发送确认消息: post the next receive, SEND "ACK: " + the message, wait for its completion;
 *  - 清理资源并退出: destroy everything; fail unless at least one message was acknowledged.
 *
 * Usage: seed003_server PORT      (the client: seed003_client HOST PORT)
 * Prints "seed003 server: OK (N messages)" and exits 0, or exits non-zero. */
#include <poll.h>
#include "seed_util.h"

#define BUF 256
#define EXPECTED "Hello, RDMA!"

static struct ibv_context *ctx;
static struct ibv_comp_channel *channel;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *recv_mr, *send_mr;
static char recv_buf[BUF], send_buf[BUF];
static int sock;

static void post_receive(void)
{
  struct ibv_sge sge = {.addr = (uintptr_t)recv_buf, .length = BUF, .lkey = recv_mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;
  memset(recv_buf, 0, BUF);
  if (ibv_post_recv(qp, &wr, &bad))
    seed_fail("seed003 server: ibv_post_recv: %s", strerror(errno));
}

/* Next completion from the CQ, waiting on its channel; returns 0 if instead the client closed
 * the TCP connection (only when watch_peer). */
static int next_completion(struct ibv_wc *wc, int watch_peer)
{
  for (;;) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0)
      seed_fail("seed003 server: ibv_poll_cq: %d", n);
    if (n == 1) {
      if (wc->status != IBV_WC_SUCCESS)
        seed_fail("seed003 server: completion status %s", ibv_wc_status_str(wc->status));
      return 1;
    }
    struct pollfd p[2] = {{.fd = channel->fd, .events = POLLIN}, {.fd = sock, .events = POLLIN}};
    if (poll(p, watch_peer ? 2 : 1, -1) < 0 && errno != EINTR)
      seed_fail("seed003 server: poll: %s", strerror(errno));
    if (p[0].revents & POLLIN) {
      struct ibv_cq *ev_cq;
      void *ev_ctx;
      if (ibv_get_cq_event(channel, &ev_cq, &ev_ctx))
        seed_fail("seed003 server: ibv_get_cq_event: %s", strerror(errno));
      ibv_ack_cq_events(ev_cq, 1);
      if (ibv_req_notify_cq(cq, 0))
        seed_fail("seed003 server: ibv_req_notify_cq: %s", strerror(errno));
      continue;
    }
    if (watch_peer && (p[1].revents & (POLLIN | POLLHUP))) {
      char c;
      ssize_t r = read(sock, &c, 1);
      if (r == 0)
        return 0;
      seed_fail("seed003 server: unexpected data from the client on TCP");
    }
  }
}

int main(int argc, char **argv)
{
  int messages = 0;
  if (argc != 2) {
    fprintf(stderr, "usage: %s PORT\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);

  // 初始化RDMA设备和资源...
  int num;
  struct ibv_device **list = ibv_get_device_list(&num);
  if (!list || num < 1)
    seed_fail("seed003 server: no RDMA device");
  ctx = ibv_open_device(list[0]);
  if (!ctx)
    seed_fail("seed003 server: ibv_open_device: %s", strerror(errno));
  struct ibv_device_attr da;
  if (ibv_query_device(ctx, &da))
    seed_fail("seed003 server: ibv_query_device: %s", strerror(errno));
  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  if (!pd)
    seed_fail("seed003 server: ibv_alloc_pd: %s", strerror(errno));
  channel = ibv_create_comp_channel(ctx);
  if (!channel)
    seed_fail("seed003 server: ibv_create_comp_channel: %s", strerror(errno));
  cq = ibv_create_cq(ctx, 8, NULL, channel, 0);
  if (!cq)
    seed_fail("seed003 server: ibv_create_cq: %s", strerror(errno));
  if (ibv_req_notify_cq(cq, 0))
    seed_fail("seed003 server: ibv_req_notify_cq: %s", strerror(errno));
  recv_mr = ibv_reg_mr(pd, recv_buf, BUF, IBV_ACCESS_LOCAL_WRITE);
  send_mr = ibv_reg_mr(pd, send_buf, BUF, 0);
  if (!recv_mr || !send_mr)
    seed_fail("seed003 server: ibv_reg_mr: %s", strerror(errno));

  // 创建并配置队列对(QP)...
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof(ia));
  ia.qp_type = IBV_QPT_RC;
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.cap.max_send_wr = 4;
  ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  qp = ibv_create_qp(pd, &ia);
  if (!qp)
    seed_fail("seed003 server: ibv_create_qp: %s", strerror(errno));
  seed_qp_init(qp, 0);
  post_receive();
  struct seed_peer me = {.qpn = qp->qp_num, .psn = seed_psn()}, peer;
  int gid_index = seed_gid(ctx, &me.gid);
  sock = seed_tcp_serve(atoi(argv[1]));
  seed_recv_peer(sock, &peer);
  seed_qp_connect(qp, ctx, gid_index, me.psn, &peer);
  seed_send_peer(sock, &me);

  // 等待接收消息...
  while (1) {
    // 接收消息...
    struct ibv_wc wc;
    if (!next_completion(&wc, 1))
      break; /* the client is gone */
    if (wc.opcode != IBV_WC_RECV || wc.wr_id != 1)
      seed_fail("seed003 server: expected a receive, got opcode %d wr_id %" PRIu64, wc.opcode,
                wc.wr_id);
    char *received_message = recv_buf;
    if (wc.byte_len != sizeof(EXPECTED) || memcmp(received_message, EXPECTED, sizeof(EXPECTED)))
      seed_fail("seed003 server: received %u bytes \"%.*s\", expected \"%s\"", wc.byte_len,
                (int)wc.byte_len, received_message, EXPECTED);

    printf("Received message: %s\n", received_message);

    // 发送确认消息...
    int len = snprintf(send_buf, BUF, "ACK: %s", received_message) + 1;
    post_receive();
    struct ibv_sge sge = {.addr = (uintptr_t)send_buf, .length = (uint32_t)len,
                          .lkey = send_mr->lkey};
    struct ibv_send_wr swr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    if (ibv_post_send(qp, &swr, &bad))
      seed_fail("seed003 server: ibv_post_send: %s", strerror(errno));
    if (!next_completion(&wc, 0) || wc.opcode != IBV_WC_SEND || wc.wr_id != 2)
      seed_fail("seed003 server: expected the acknowledgement's send completion, got opcode %d",
                wc.opcode);
    messages++;
  }

  // 清理资源并退出...
  close(sock);
  if (ibv_destroy_qp(qp) || ibv_dereg_mr(recv_mr) || ibv_dereg_mr(send_mr) ||
      ibv_destroy_cq(cq) || ibv_destroy_comp_channel(channel) || ibv_dealloc_pd(pd) ||
      ibv_close_device(ctx))
    seed_fail("seed003 server: cleanup: %s", strerror(errno));
  ibv_free_device_list(list);
  if (messages < 1)
    seed_fail("seed003 server: the client left without a message");
  printf("seed003 server: OK (%d messages)\n", messages);
  return 0;
}
