/* From seed 004_6a0081eb15e9a6e6.txt ("RDMA的ibv_post_send() 函数"): the prototype
 *
 *   int ibv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
 *
 * and struct ibv_send_wr, whose opcode "决定了数据传输类型": wr_id, next, sg_list, num_sge, opcode,
 * send_flags, imm_data and the union wr.rdma {remote_addr, rkey} / wr.atomic {remote_addr,
 * compare_add, swap, rkey} / wr.ud {ah, remote_qpn, remote_qkey}. The seed describes IBV_WR_SEND
 * (the data lands in the buffers of the receive request at the head of the remote QP's receive
 * queue) and IBV_WR_RDMA_WRITE (the data lands in a contiguous range of the remote QP's virtual
 * space; no receive request is consumed).
 *
 * The seed is a fragment: everything around ibv_post_send is completed here, as a client and a
 * server on plain verbs (the seed has no connection manager) that exchange QP numbers, GIDs and
 * the server's buffer address and rkey over TCP (seed_util.h). The client posts one work request
 * per opcode the seed's structure carries, filling the fields the seed lists, and checks each
 * completion; the server checks what arrived:
 *
 *   IBV_WR_SEND                 server: receive completion IBV_WC_RECV, no IBV_WC_WITH_IMM,
 *                               byte_len and every byte as sent
 *   IBV_WR_SEND_WITH_IMM        server: IBV_WC_RECV with IBV_WC_WITH_IMM; imm_data is the
 *                               client's htonl(0x12345678) (ntohl gives it back); the bytes
 *   IBV_WR_RDMA_WRITE           posted in one list (wr->next) with the next one; the bytes are in
 *                               the server's buffer (checked by the server, and read back by
 *                               the client), no receive consumed
 *   IBV_WR_RDMA_WRITE_WITH_IMM  server: IBV_WC_RECV_RDMA_WITH_IMM with IBV_WC_WITH_IMM,
 *                               htonl(0xcafef00d), byte_len = the write's length, the receive
 *                               buffer untouched, the bytes in the server's buffer
 *   IBV_WR_RDMA_READ            client: IBV_WC_RDMA_READ, the server's bytes
 *   IBV_WR_ATOMIC_CMP_AND_SWP   client: IBV_WC_COMP_SWAP returns the old value; once with a
 *                               matching compare (remote changes), once without (it does not)
 *   IBV_WR_ATOMIC_FETCH_AND_ADD client: IBV_WC_FETCH_ADD returns the old value; twice (a carry
 *                               into the upper 32 bits, then adding -1)
 *   then an RDMA_READ of both atomic words, and a final SEND after which the server checks its
 *   memory: the atomics' results, the written ranges, the read range unchanged.
 * Every completion's status, opcode and wr_id is checked. (wr.ud is the UD transport's part of
 * the union; there is no UD QP here.)
 *
 * Usage: seed004_post_send server PORT
 *        seed004_post_send client HOST PORT
 * Prints "seed004 server: OK" / "seed004 client: OK" and exits 0, or exits non-zero. */
#include "seed_util.h"

/* The server's exposed buffer. */
#define REGION 16384
#define WRITE_OFF 0
#define WRITE_LEN 5000
#define WIMM_OFF 5120
#define WIMM_LEN 3000
#define READ_OFF 8192
#define READ_LEN 6000
#define ATOMIC_OFF 14336 /* two 64-bit words: compare-and-swap, fetch-and-add */

/* The server's receive buffers: one slot per receive request. */
#define SLOTS 4
#define SLOT 4096

#define SEND_LEN 2000
#define SEND_IMM_LEN 1500
#define DONE_LEN 16

#define IMM_SEND 0x12345678u
#define IMM_WRITE 0xcafef00du

#define CAS_OLD 0x0123456789abcdefull
#define CAS_NEW 0xfedcba9876543210ull
#define CAS_OTHER 0x1111111111111111ull
#define FADD_INIT 0x00000001fffffff0ull
#define FADD_1 0x20ull
#define FADD_2 0xffffffffffffffffull /* -1 */

static unsigned char pat(int which, size_t i)
{
  return (unsigned char)(i * 131 + (size_t)which * 17 + (i >> 8));
}

static void fill(char *p, int which, size_t len)
{
  for (size_t i = 0; i < len; i++)
    p[i] = (char)pat(which, i);
}

static void expect_bytes(const char *who, const char *what, const char *p, int which, size_t len)
{
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)p[i] != pat(which, i))
      seed_fail("%s: %s: byte %zu is %#x, expected %#x", who, what, i, (unsigned char)p[i],
                pat(which, i));
}

static const char *who;

/* ibv_post_send as the seed declares it, with its bad_wr. */
static void post(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
  struct ibv_send_wr *bad_wr = NULL;
  int ret = ibv_post_send(qp, wr, &bad_wr);
  if (ret)
    seed_fail("%s: ibv_post_send (wr_id %" PRIu64 "): %s", who,
              bad_wr ? bad_wr->wr_id : wr->wr_id, strerror(ret));
}

/* The next completion: success, with this opcode and wr_id. */
static void expect_wc(struct ibv_cq *cq, struct ibv_wc *wc, enum ibv_wc_opcode opcode,
                      uint64_t wr_id, const char *what)
{
  seed_poll_one(cq, wc);
  if (wc->status != IBV_WC_SUCCESS)
    seed_fail("%s: %s: completion status %s (wr_id %" PRIu64 ")", who, what,
              ibv_wc_status_str(wc->status), wc->wr_id);
  if (wc->opcode != opcode || wc->wr_id != wr_id)
    seed_fail("%s: %s: completion opcode %d wr_id %" PRIu64 ", expected %d and %" PRIu64, who,
              what, wc->opcode, wc->wr_id, opcode, wr_id);
  printf("%s: %s completed\n", who, what);
}

static int run_server(int port)
{
  who = "seed004 server";
  int num;
  struct ibv_device **list = ibv_get_device_list(&num);
  if (!list || num < 1)
    seed_fail("%s: no RDMA device", who);
  struct ibv_context *ctx = ibv_open_device(list[0]);
  if (!ctx)
    seed_fail("%s: ibv_open_device: %s", who, strerror(errno));
  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
  if (!cq)
    seed_fail("%s: ibv_alloc_pd/ibv_create_cq: %s", who, strerror(errno));
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof(ia));
  ia.qp_type = IBV_QPT_RC;
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.cap.max_send_wr = 16;
  ia.cap.max_recv_wr = SLOTS;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  struct ibv_qp *qp = ibv_create_qp(pd, &ia);
  if (!qp)
    seed_fail("%s: ibv_create_qp: %s", who, strerror(errno));

  char *region = aligned_alloc(4096, REGION);
  char *slots = aligned_alloc(4096, SLOTS * SLOT);
  if (!region || !slots)
    seed_fail("%s: out of memory", who);
  memset(region, 0, REGION);
  memset(slots, 0, SLOTS * SLOT);
  fill(region + READ_OFF, 5, READ_LEN);
  uint64_t *atom = (uint64_t *)(region + ATOMIC_OFF);
  atom[0] = CAS_OLD;
  atom[1] = FADD_INIT;
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
               IBV_ACCESS_REMOTE_ATOMIC;
  struct ibv_mr *mr = ibv_reg_mr(pd, region, REGION, access);
  struct ibv_mr *slots_mr = ibv_reg_mr(pd, slots, SLOTS * SLOT, IBV_ACCESS_LOCAL_WRITE);
  if (!mr || !slots_mr)
    seed_fail("%s: ibv_reg_mr: %s", who, strerror(errno));

  seed_qp_init(qp, access);
  for (int s = 0; s < SLOTS; s++) {
    struct ibv_sge sge = {
        .addr = (uintptr_t)(slots + s * SLOT), .length = SLOT, .lkey = slots_mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = 100 + s, .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr *bad = NULL;
    if (ibv_post_recv(qp, &wr, &bad))
      seed_fail("%s: ibv_post_recv: %s", who, strerror(errno));
  }

  struct seed_peer me = {.qpn = qp->qp_num, .psn = seed_psn(), .addr = (uintptr_t)region,
                         .rkey = mr->rkey};
  struct seed_peer peer;
  int gid_index = seed_gid(ctx, &me.gid);
  int sock = seed_tcp_serve(port);
  seed_recv_peer(sock, &peer);
  seed_qp_connect(qp, ctx, gid_index, me.psn, &peer);
  seed_send_peer(sock, &me);

  struct ibv_wc wc;
  /* IBV_WR_SEND */
  expect_wc(cq, &wc, IBV_WC_RECV, 100, "receive of IBV_WR_SEND");
  if ((wc.wc_flags & IBV_WC_WITH_IMM) || wc.byte_len != SEND_LEN || wc.qp_num != qp->qp_num)
    seed_fail("%s: SEND: flags %#x byte_len %u qp %u", who, wc.wc_flags, wc.byte_len, wc.qp_num);
  expect_bytes(who, "SEND", slots, 1, SEND_LEN);
  /* IBV_WR_SEND_WITH_IMM */
  expect_wc(cq, &wc, IBV_WC_RECV, 101, "receive of IBV_WR_SEND_WITH_IMM");
  if (!(wc.wc_flags & IBV_WC_WITH_IMM) || wc.byte_len != SEND_IMM_LEN)
    seed_fail("%s: SEND_WITH_IMM: flags %#x byte_len %u", who, wc.wc_flags, wc.byte_len);
  if (ntohl(wc.imm_data) != IMM_SEND)
    seed_fail("%s: SEND_WITH_IMM: imm_data %#x, ntohl %#x, sent htonl(%#x)", who, wc.imm_data,
              ntohl(wc.imm_data), IMM_SEND);
  expect_bytes(who, "SEND_WITH_IMM", slots + SLOT, 2, SEND_IMM_LEN);
  /* IBV_WR_RDMA_WRITE, then IBV_WR_RDMA_WRITE_WITH_IMM: only the latter consumes a receive */
  expect_wc(cq, &wc, IBV_WC_RECV_RDMA_WITH_IMM, 102, "receive of IBV_WR_RDMA_WRITE_WITH_IMM");
  if (!(wc.wc_flags & IBV_WC_WITH_IMM) || wc.byte_len != WIMM_LEN)
    seed_fail("%s: RDMA_WRITE_WITH_IMM: flags %#x byte_len %u", who, wc.wc_flags, wc.byte_len);
  if (ntohl(wc.imm_data) != IMM_WRITE)
    seed_fail("%s: RDMA_WRITE_WITH_IMM: imm_data %#x, ntohl %#x, sent htonl(%#x)", who,
              wc.imm_data, ntohl(wc.imm_data), IMM_WRITE);
  for (size_t i = 0; i < SLOT; i++)
    if (slots[2 * SLOT + i] != 0)
      seed_fail("%s: RDMA_WRITE_WITH_IMM wrote into the receive buffer (byte %zu)", who, i);
  expect_bytes(who, "RDMA_WRITE", region + WRITE_OFF, 3, WRITE_LEN);
  expect_bytes(who, "RDMA_WRITE_WITH_IMM", region + WIMM_OFF, 4, WIMM_LEN);
  /* The final SEND: the client's READs and atomics are done */
  expect_wc(cq, &wc, IBV_WC_RECV, 103, "receive of the final IBV_WR_SEND");
  if (wc.byte_len != DONE_LEN)
    seed_fail("%s: final SEND: byte_len %u", who, wc.byte_len);
  expect_bytes(who, "final SEND", slots + 3 * SLOT, 6, DONE_LEN);
  if (atom[0] != CAS_NEW)
    seed_fail("%s: compare-and-swap word is %#" PRIx64 ", expected %#" PRIx64, who, atom[0],
              (uint64_t)CAS_NEW);
  if (atom[1] != FADD_INIT + FADD_1 + FADD_2)
    seed_fail("%s: fetch-and-add word is %#" PRIx64 ", expected %#" PRIx64, who, atom[1],
              (uint64_t)(FADD_INIT + FADD_1 + FADD_2));
  expect_bytes(who, "RDMA_READ source (unchanged)", region + READ_OFF, 5, READ_LEN);
  expect_bytes(who, "RDMA_WRITE (still)", region + WRITE_OFF, 3, WRITE_LEN);
  for (size_t i = WRITE_OFF + WRITE_LEN; i < WIMM_OFF; i++)
    if (region[i] != 0)
      seed_fail("%s: byte %zu past the RDMA_WRITE changed", who, i);
  for (size_t i = WIMM_OFF + WIMM_LEN; i < READ_OFF; i++)
    if (region[i] != 0)
      seed_fail("%s: byte %zu past the RDMA_WRITE_WITH_IMM changed", who, i);
  printf("%s: memory after the atomics: %#" PRIx64 " %#" PRIx64 "\n", who, atom[0], atom[1]);

  if (seed_sync(sock, 'k') != 'k')
    seed_fail("%s: the client reported a failure", who);
  close(sock);
  if (ibv_destroy_qp(qp) || ibv_dereg_mr(mr) || ibv_dereg_mr(slots_mr) || ibv_destroy_cq(cq) ||
      ibv_dealloc_pd(pd) || ibv_close_device(ctx))
    seed_fail("%s: cleanup: %s", who, strerror(errno));
  ibv_free_device_list(list);
  printf("%s: OK\n", who);
  return 0;
}

/* The client's buffer. */
#define L_SEND 0
#define L_SEND_IMM 2048
#define L_WRITE 4096
#define L_WIMM 12288
#define L_READ 16384
#define L_READ_WRITE 24576 /* the RDMA_WRITE read back */
#define L_ATOMIC 32768     /* the atomics' returned values, 8-byte aligned */
#define L_READ_ATOMIC 32800
#define L_DONE 32832
#define L_SIZE 36864

static int run_client(const char *host, const char *port)
{
  who = "seed004 client";
  int num;
  struct ibv_device **list = ibv_get_device_list(&num);
  if (!list || num < 1)
    seed_fail("%s: no RDMA device", who);
  struct ibv_context *ctx = ibv_open_device(list[0]);
  if (!ctx)
    seed_fail("%s: ibv_open_device: %s", who, strerror(errno));
  struct ibv_device_attr da;
  if (ibv_query_device(ctx, &da))
    seed_fail("%s: ibv_query_device: %s", who, strerror(errno));
  if (da.atomic_cap == IBV_ATOMIC_NONE)
    seed_fail("%s: %s has no atomics (atomic_cap IBV_ATOMIC_NONE)", who,
              ibv_get_device_name(list[0]));
  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
  if (!cq)
    seed_fail("%s: ibv_alloc_pd/ibv_create_cq: %s", who, strerror(errno));
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof(ia));
  ia.qp_type = IBV_QPT_RC;
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.cap.max_send_wr = 16;
  ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  struct ibv_qp *qp = ibv_create_qp(pd, &ia);
  if (!qp)
    seed_fail("%s: ibv_create_qp: %s", who, strerror(errno));
  char *buf = aligned_alloc(4096, L_SIZE);
  if (!buf)
    seed_fail("%s: out of memory", who);
  memset(buf, 0, L_SIZE);
  struct ibv_mr *mr = ibv_reg_mr(pd, buf, L_SIZE, IBV_ACCESS_LOCAL_WRITE);
  if (!mr)
    seed_fail("%s: ibv_reg_mr: %s", who, strerror(errno));

  seed_qp_init(qp, 0);
  struct seed_peer me = {.qpn = qp->qp_num, .psn = seed_psn()};
  struct seed_peer peer;
  int gid_index = seed_gid(ctx, &me.gid);
  int sock = seed_tcp_reach(host, port);
  seed_send_peer(sock, &me);
  seed_recv_peer(sock, &peer);
  seed_qp_connect(qp, ctx, gid_index, me.psn, &peer);

  struct ibv_wc wc;
  struct ibv_sge sge[2];
  struct ibv_send_wr wr[2];

  /* IBV_WR_SEND */
  fill(buf + L_SEND, 1, SEND_LEN);
  sge[0] = (struct ibv_sge){.addr = (uintptr_t)(buf + L_SEND), .length = SEND_LEN,
                            .lkey = mr->lkey};
  memset(&wr[0], 0, sizeof(wr[0]));
  wr[0].wr_id = 1;
  wr[0].next = NULL;
  wr[0].sg_list = &sge[0];
  wr[0].num_sge = 1;
  wr[0].opcode = IBV_WR_SEND;
  wr[0].send_flags = IBV_SEND_SIGNALED;
  post(qp, &wr[0]);
  expect_wc(cq, &wc, IBV_WC_SEND, 1, "IBV_WR_SEND");

  /* IBV_WR_SEND_WITH_IMM: imm_data in network byte order */
  fill(buf + L_SEND_IMM, 2, SEND_IMM_LEN);
  sge[0] = (struct ibv_sge){.addr = (uintptr_t)(buf + L_SEND_IMM), .length = SEND_IMM_LEN,
                            .lkey = mr->lkey};
  memset(&wr[0], 0, sizeof(wr[0]));
  wr[0].wr_id = 2;
  wr[0].sg_list = &sge[0];
  wr[0].num_sge = 1;
  wr[0].opcode = IBV_WR_SEND_WITH_IMM;
  wr[0].send_flags = IBV_SEND_SIGNALED;
  wr[0].imm_data = htonl(IMM_SEND);
  post(qp, &wr[0]);
  expect_wc(cq, &wc, IBV_WC_SEND, 2, "IBV_WR_SEND_WITH_IMM");

  /* IBV_WR_RDMA_WRITE -> next -> IBV_WR_RDMA_WRITE_WITH_IMM, one ibv_post_send */
  fill(buf + L_WRITE, 3, WRITE_LEN);
  fill(buf + L_WIMM, 4, WIMM_LEN);
  sge[0] = (struct ibv_sge){.addr = (uintptr_t)(buf + L_WRITE), .length = WRITE_LEN,
                            .lkey = mr->lkey};
  sge[1] = (struct ibv_sge){.addr = (uintptr_t)(buf + L_WIMM), .length = WIMM_LEN,
                            .lkey = mr->lkey};
  memset(wr, 0, sizeof(wr));
  wr[0].wr_id = 3;
  wr[0].next = &wr[1];
  wr[0].sg_list = &sge[0];
  wr[0].num_sge = 1;
  wr[0].opcode = IBV_WR_RDMA_WRITE;
  wr[0].send_flags = IBV_SEND_SIGNALED;
  wr[0].wr.rdma.remote_addr = peer.addr + WRITE_OFF;
  wr[0].wr.rdma.rkey = peer.rkey;
  wr[1].wr_id = 4;
  wr[1].next = NULL;
  wr[1].sg_list = &sge[1];
  wr[1].num_sge = 1;
  wr[1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr[1].send_flags = IBV_SEND_SIGNALED;
  wr[1].imm_data = htonl(IMM_WRITE);
  wr[1].wr.rdma.remote_addr = peer.addr + WIMM_OFF;
  wr[1].wr.rdma.rkey = peer.rkey;
  post(qp, &wr[0]);
  expect_wc(cq, &wc, IBV_WC_RDMA_WRITE, 3, "IBV_WR_RDMA_WRITE");
  expect_wc(cq, &wc, IBV_WC_RDMA_WRITE, 4, "IBV_WR_RDMA_WRITE_WITH_IMM");

  /* IBV_WR_RDMA_READ of the server's bytes */
  sge[0] = (struct ibv_sge){.addr = (uintptr_t)(buf + L_READ), .length = READ_LEN,
                            .lkey = mr->lkey};
  memset(&wr[0], 0, sizeof(wr[0]));
  wr[0].wr_id = 5;
  wr[0].sg_list = &sge[0];
  wr[0].num_sge = 1;
  wr[0].opcode = IBV_WR_RDMA_READ;
  wr[0].send_flags = IBV_SEND_SIGNALED;
  wr[0].wr.rdma.remote_addr = peer.addr + READ_OFF;
  wr[0].wr.rdma.rkey = peer.rkey;
  post(qp, &wr[0]);
  expect_wc(cq, &wc, IBV_WC_RDMA_READ, 5, "IBV_WR_RDMA_READ");
  expect_bytes(who, "RDMA_READ", buf + L_READ, 5, READ_LEN);

  /* IBV_WR_RDMA_READ of what the RDMA_WRITE put there */
  sge[0] = (struct ibv_sge){.addr = (uintptr_t)(buf + L_READ_WRITE), .length = WRITE_LEN,
                            .lkey = mr->lkey};
  wr[0].wr_id = 6;
  wr[0].wr.rdma.remote_addr = peer.addr + WRITE_OFF;
  post(qp, &wr[0]);
  expect_wc(cq, &wc, IBV_WC_RDMA_READ, 6, "IBV_WR_RDMA_READ of the written range");
  expect_bytes(who, "RDMA_WRITE read back", buf + L_READ_WRITE, 3, WRITE_LEN);

  /* IBV_WR_ATOMIC_CMP_AND_SWP: compare matches, the old value comes back, remote is swapped */
  uint64_t *old = (uint64_t *)(buf + L_ATOMIC);
  sge[0] = (struct ibv_sge){.addr = (uintptr_t)old, .length = 8, .lkey = mr->lkey};
  memset(&wr[0], 0, sizeof(wr[0]));
  wr[0].wr_id = 7;
  wr[0].sg_list = &sge[0];
  wr[0].num_sge = 1;
  wr[0].opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  wr[0].send_flags = IBV_SEND_SIGNALED;
  wr[0].wr.atomic.remote_addr = peer.addr + ATOMIC_OFF;
  wr[0].wr.atomic.compare_add = CAS_OLD;
  wr[0].wr.atomic.swap = CAS_NEW;
  wr[0].wr.atomic.rkey = peer.rkey;
  *old = 0;
  post(qp, &wr[0]);
  expect_wc(cq, &wc, IBV_WC_COMP_SWAP, 7, "IBV_WR_ATOMIC_CMP_AND_SWP (match)");
  if (*old != CAS_OLD)
    seed_fail("%s: CMP_AND_SWP returned %#" PRIx64 ", the old value was %#" PRIx64, who, *old,
              (uint64_t)CAS_OLD);

  /* ... compare no longer matches: the current value comes back, remote is not swapped */
  wr[0].wr_id = 8;
  wr[0].wr.atomic.swap = CAS_OTHER;
  *old = 0;
  post(qp, &wr[0]);
  expect_wc(cq, &wc, IBV_WC_COMP_SWAP, 8, "IBV_WR_ATOMIC_CMP_AND_SWP (no match)");
  if (*old != CAS_NEW)
    seed_fail("%s: CMP_AND_SWP (no match) returned %#" PRIx64 ", the value was %#" PRIx64, who,
              *old, (uint64_t)CAS_NEW);

  /* IBV_WR_ATOMIC_FETCH_AND_ADD, twice */
  sge[0].addr = (uintptr_t)(old + 1);
  memset(&wr[0], 0, sizeof(wr[0]));
  wr[0].wr_id = 9;
  wr[0].sg_list = &sge[0];
  wr[0].num_sge = 1;
  wr[0].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  wr[0].send_flags = IBV_SEND_SIGNALED;
  wr[0].wr.atomic.remote_addr = peer.addr + ATOMIC_OFF + 8;
  wr[0].wr.atomic.compare_add = FADD_1;
  wr[0].wr.atomic.rkey = peer.rkey;
  old[1] = 0;
  post(qp, &wr[0]);
  expect_wc(cq, &wc, IBV_WC_FETCH_ADD, 9, "IBV_WR_ATOMIC_FETCH_AND_ADD (+0x20)");
  if (old[1] != FADD_INIT)
    seed_fail("%s: FETCH_AND_ADD returned %#" PRIx64 ", the old value was %#" PRIx64, who,
              old[1], (uint64_t)FADD_INIT);
  wr[0].wr_id = 10;
  wr[0].wr.atomic.compare_add = FADD_2;
  old[1] = 0;
  post(qp, &wr[0]);
  expect_wc(cq, &wc, IBV_WC_FETCH_ADD, 10, "IBV_WR_ATOMIC_FETCH_AND_ADD (-1)");
  if (old[1] != FADD_INIT + FADD_1)
    seed_fail("%s: FETCH_AND_ADD returned %#" PRIx64 ", the old value was %#" PRIx64, who,
              old[1], (uint64_t)(FADD_INIT + FADD_1));

  /* IBV_WR_RDMA_READ of both atomic words */
  uint64_t *now = (uint64_t *)(buf + L_READ_ATOMIC);
  sge[0] = (struct ibv_sge){.addr = (uintptr_t)now, .length = 16, .lkey = mr->lkey};
  memset(&wr[0], 0, sizeof(wr[0]));
  wr[0].wr_id = 11;
  wr[0].sg_list = &sge[0];
  wr[0].num_sge = 1;
  wr[0].opcode = IBV_WR_RDMA_READ;
  wr[0].send_flags = IBV_SEND_SIGNALED;
  wr[0].wr.rdma.remote_addr = peer.addr + ATOMIC_OFF;
  wr[0].wr.rdma.rkey = peer.rkey;
  post(qp, &wr[0]);
  expect_wc(cq, &wc, IBV_WC_RDMA_READ, 11, "IBV_WR_RDMA_READ of the atomic words");
  if (now[0] != CAS_NEW || now[1] != FADD_INIT + FADD_1 + FADD_2)
    seed_fail("%s: the atomic words read back as %#" PRIx64 " %#" PRIx64 ", expected %#" PRIx64
              " %#" PRIx64,
              who, now[0], now[1], (uint64_t)CAS_NEW, (uint64_t)(FADD_INIT + FADD_1 + FADD_2));

  /* A final IBV_WR_SEND: the server checks its memory */
  fill(buf + L_DONE, 6, DONE_LEN);
  sge[0] = (struct ibv_sge){.addr = (uintptr_t)(buf + L_DONE), .length = DONE_LEN,
                            .lkey = mr->lkey};
  memset(&wr[0], 0, sizeof(wr[0]));
  wr[0].wr_id = 12;
  wr[0].sg_list = &sge[0];
  wr[0].num_sge = 1;
  wr[0].opcode = IBV_WR_SEND;
  wr[0].send_flags = IBV_SEND_SIGNALED;
  post(qp, &wr[0]);
  expect_wc(cq, &wc, IBV_WC_SEND, 12, "final IBV_WR_SEND");

  /* The server answers 'k' once its checks passed (it exits, closing the socket, if not). */
  if (seed_sync(sock, 'k') != 'k')
    seed_fail("%s: the server reported a failure", who);
  close(sock);
  if (ibv_destroy_qp(qp) || ibv_dereg_mr(mr) || ibv_destroy_cq(cq) || ibv_dealloc_pd(pd) ||
      ibv_close_device(ctx))
    seed_fail("%s: cleanup: %s", who, strerror(errno));
  ibv_free_device_list(list);
  printf("%s: OK\n", who);
  return 0;
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 3 && strcmp(argv[1], "server") == 0)
    return run_server(atoi(argv[2]));
  if (argc == 4 && strcmp(argv[1], "client") == 0)
    return run_client(argv[2], argv[3]);
  fprintf(stderr, "usage: %s server PORT | client HOST PORT\n", argv[0]);
  return 2;
}
