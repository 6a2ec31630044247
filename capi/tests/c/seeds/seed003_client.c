/* From seed 003_278a4ec17b85a863.txt ("一文读懂RDMA", 四、RDMA的代码演示, 客户端代码). The seed's
 * client is a skeleton: initialise the device and resources, create and configure the QP, send
 * char *message = "Hello, RDMA!" to the server, wait for and receive the acknowledgement, print
 * "Received acknowledgment from server.", clean up. Its structure, message and printf are kept;
 * the elided steps ("省略...代码") are completed as in seed003_server.c:
 *  - 初始化RDMA设备和资源: the first device, a PD, a CQ, two registered buffers;
 *  - 创建并配置队列对: an RC QP taken to RTS after exchanging QP numbers and GIDs with the server
 *    over TCP (seed_util.h); the receive for the acknowledgement is posted before the send;
 *  - 发送消息: SEND the message with its NUL;
 *  - 等待并接收服务器的确认消息: poll for both completions; the acknowledgement must be
 *    "ACK: Hello, RDMA!" or the client fails;
 *  - 清理资源并退出: half-close the TCP connection (which ends the server's loop) and wait for the
 *    server to close it, so that the server has its send completion before this QP goes away.
 *
 * Usage: seed003_client HOST PORT
 * Prints "seed003 client: OK" and exits 0, or exits non-zero. */
#include "seed_util.h"

#define BUF 256

int main(int argc, char **argv)
{
  if (argc != 3) {
    fprintf(stderr, "usage: %s HOST PORT\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);

  // 初始化RDMA设备和资源...
  static char send_buf[BUF], recv_buf[BUF];
  int num;
  struct ibv_device **list = ibv_get_device_list(&num);
  if (!list || num < 1)
    seed_fail("seed003 client: no RDMA device");
  struct ibv_context *ctx = ibv_open_device(list[0]);
  if (!ctx)
    seed_fail("seed003 client: ibv_open_device: %s", strerror(errno));
  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 8, NULL, NULL, 0) : NULL;
  if (!cq)
    seed_fail("seed003 client: ibv_alloc_pd/ibv_create_cq: %s", strerror(errno));
  struct ibv_mr *send_mr = ibv_reg_mr(pd, send_buf, BUF, 0);
  struct ibv_mr *recv_mr = ibv_reg_mr(pd, recv_buf, BUF, IBV_ACCESS_LOCAL_WRITE);
  if (!send_mr || !recv_mr)
    seed_fail("seed003 client: ibv_reg_mr: %s", strerror(errno));

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
  struct ibv_qp *qp = ibv_create_qp(pd, &ia);
  if (!qp)
    seed_fail("seed003 client: ibv_create_qp: %s", strerror(errno));
  seed_qp_init(qp, 0);
  struct ibv_sge rsge = {.addr = (uintptr_t)recv_buf, .length = BUF, .lkey = recv_mr->lkey};
  struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &rsge, .num_sge = 1}, *rbad;
  if (ibv_post_recv(qp, &rwr, &rbad))
    seed_fail("seed003 client: ibv_post_recv: %s", strerror(errno));
  struct seed_peer me = {.qpn = qp->qp_num, .psn = seed_psn()}, peer;
  int gid_index = seed_gid(ctx, &me.gid);
  int sock = seed_tcp_reach(argv[1], argv[2]);
  seed_send_peer(sock, &me);
  seed_recv_peer(sock, &peer);
  seed_qp_connect(qp, ctx, gid_index, me.psn, &peer);

  // 发送消息到服务器...
  char *message = "Hello, RDMA!";
  size_t len = strlen(message) + 1;
  memcpy(send_buf, message, len);
  struct ibv_sge ssge = {.addr = (uintptr_t)send_buf, .length = (uint32_t)len,
                         .lkey = send_mr->lkey};
  struct ibv_send_wr swr = {.wr_id = 2, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND,
                            .send_flags = IBV_SEND_SIGNALED},
                     *sbad;
  if (ibv_post_send(qp, &swr, &sbad))
    seed_fail("seed003 client: ibv_post_send: %s", strerror(errno));

  // 等待并接收服务器的确认消息...
  int sent = 0, acked = 0;
  while (!sent || !acked) {
    struct ibv_wc wc;
    seed_poll_one(cq, &wc);
    if (wc.status != IBV_WC_SUCCESS)
      seed_fail("seed003 client: completion status %s", ibv_wc_status_str(wc.status));
    if (wc.opcode == IBV_WC_SEND && wc.wr_id == 2)
      sent++;
    else if (wc.opcode == IBV_WC_RECV && wc.wr_id == 1) {
      char want[BUF];
      int n = snprintf(want, BUF, "ACK: %s", message) + 1;
      if (wc.byte_len != (uint32_t)n || memcmp(recv_buf, want, (size_t)n))
        seed_fail("seed003 client: acknowledgement \"%.*s\" (%u bytes), expected \"%s\"",
                  (int)wc.byte_len, recv_buf, wc.byte_len, want);
      acked++;
    } else
      seed_fail("seed003 client: unexpected completion opcode %d wr_id %" PRIu64, wc.opcode,
                wc.wr_id);
  }

  printf("Received acknowledgment from server.\n");

  // 清理资源并退出...
  shutdown(sock, SHUT_WR);
  char c;
  if (read(sock, &c, 1) != 0)
    seed_fail("seed003 client: unexpected data from the server on TCP");
  close(sock);
  if (ibv_destroy_qp(qp) || ibv_dereg_mr(send_mr) || ibv_dereg_mr(recv_mr) ||
      ibv_destroy_cq(cq) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
    seed_fail("seed003 client: cleanup: %s", strerror(errno));
  ibv_free_device_list(list);
  printf("seed003 client: OK\n");
  return 0;
}
