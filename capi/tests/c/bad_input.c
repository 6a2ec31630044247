/* Bad input at the libibverbs ABI: every call gets the documented errno or completion status
 * and nothing crashes. Built against the system's <infiniband/verbs.h>, linked with -libverbs,
 * run on softrdma's library. Prints each failed check and exits non-zero if there was one. */
#include "common.h"

int main(void)
{
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list || num < 1) {
		printf("FAIL no device\n");
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL, "open: errno %d", errno);
	if (!ctx)
		return 1;

	/* Queries out of range. */
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL, "query_port 2");
	union ibv_gid gid;
	errno = 0;
	CHECK(ibv_query_gid(ctx, 1, 99, &gid) == -1 && errno == EINVAL, "query_gid 99: errno %d", errno);
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid 0");

	/* NULL and destroyed handles. */
	errno = 0;
	CHECK(ibv_alloc_pd(NULL) == NULL && errno == EINVAL, "alloc_pd(NULL): errno %d", errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL, "alloc_pd");
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	CHECK(ibv_dealloc_pd(pd2) == 0, "dealloc_pd");
	CHECK(ibv_dealloc_pd(pd2) == EINVAL, "dealloc_pd twice");
	CHECK(ibv_dealloc_pd(NULL) == EINVAL, "dealloc_pd(NULL)");

	/* Memory registration. */
	char *buf = calloc(1, 65536);
	errno = 0;
	CHECK(ibv_reg_mr(pd, NULL, 100, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL,
	      "reg_mr(NULL): errno %d", errno);
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
	      "REMOTE_WRITE without LOCAL_WRITE: errno %d", errno);
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND) == NULL &&
	      errno == EOPNOTSUPP, "ODP: errno %d", errno);
	struct ibv_mr *relaxed = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
	CHECK(relaxed != NULL, "optional access flag accepted: errno %d", errno);
	CHECK(relaxed && ibv_dereg_mr(relaxed) == 0, "dereg");
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 65536, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(mr != NULL && mr->addr == buf && mr->length == 65536, "reg_mr");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc_pd with an MR");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) != 0 &&
	      errno == EOPNOTSUPP, "rereg: errno %d", errno);

	/* Unsupported objects. */
	errno = 0;
	CHECK(ibv_alloc_mw(pd, IBV_MW_TYPE_1) == NULL && errno == EOPNOTSUPP, "alloc_mw: errno %d", errno);
	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS, .fd = -1, .oflags = 0 };
	errno = 0;
	CHECK(ibv_open_xrcd(ctx, &xa) == NULL && errno == EOPNOTSUPP, "open_xrcd: errno %d", errno);
	struct ibv_alloc_dm_attr dma = { .length = 64 };
	errno = 0;
	CHECK(ibv_alloc_dm(ctx, &dma) == NULL && errno == EOPNOTSUPP, "alloc_dm: errno %d", errno);

	/* CQs and QPs. */
	errno = 0;
	CHECK(ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL, "cqe 0: errno %d", errno);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(cq != NULL, "create_cq");
	errno = 0;
	CHECK(ibv_create_qp(pd, NULL) == NULL && errno == EINVAL, "create_qp(NULL attr): errno %d", errno);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = 64 },
	};
	struct ibv_qp_init_attr bad = ia;
	bad.cap.max_send_wr = 1 << 30;
	errno = 0;
	CHECK(ibv_create_qp(pd, &bad) == NULL && errno == EINVAL, "max_send_wr too big: errno %d", errno);
	bad = ia;
	bad.qp_type = IBV_QPT_XRC_SEND;
	errno = 0;
	CHECK(ibv_create_qp(pd, &bad) == NULL, "XRC QP refused");
	struct ibv_qp *a = ibv_create_qp(pd, &ia);
	struct ibv_qp *b = ibv_create_qp(pd, &ia);
	CHECK(a && b, "create_qp: errno %d", errno);
	CHECK(ibv_destroy_cq(cq) == EBUSY, "destroy_cq in use");

	/* Wrong state: RESET -> RTS. */
	struct ibv_qp_attr st = { .qp_state = IBV_QPS_RTS };
	CHECK(ibv_modify_qp(a, &st, IBV_QP_STATE) == EINVAL, "RESET->RTS");
	CHECK(ibv_modify_qp(NULL, &st, IBV_QP_STATE) == EINVAL, "modify_qp(NULL)");

	CHECK(connect_pair(a, b, gid) == 0, "connect");
	CHECK(a->state == IBV_QPS_RTS, "qp->state follows modify: %d", a->state);

	/* Oversized and malformed work requests. */
	struct ibv_sge sges[4] = {
		{ (uintptr_t)buf, 8, mr->lkey }, { (uintptr_t)buf + 8, 8, mr->lkey },
		{ (uintptr_t)buf + 16, 8, mr->lkey }, { (uintptr_t)buf + 24, 8, mr->lkey },
	};
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = sges, .num_sge = 4, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad_wr = NULL;
	CHECK(ibv_post_send(a, &wr, &bad_wr) != 0 && bad_wr == &wr, "too many SGEs");
	struct ibv_send_wr wr2 = wr, wr1 = wr;
	wr1.num_sge = 1;
	wr1.next = &wr2;
	wr2.opcode = IBV_WR_BIND_MW;
	wr2.num_sge = 1;
	bad_wr = NULL;
	CHECK(ibv_post_send(a, &wr1, &bad_wr) == EINVAL && bad_wr == &wr2, "bad opcode second: bad_wr %p", (void *)bad_wr);
	/* wr1 was posted: there is no receive on b, so b answers RNR until one is posted. */
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = sges, .num_sge = 1 };
	struct ibv_recv_wr *bad_rwr;
	CHECK(ibv_post_recv(b, &rwr, &bad_rwr) == 0, "post_recv");
	struct ibv_wc wc;
	CHECK(poll_one(cq, &wc) == 1, "completion of the first WR");
	CHECK(poll_one(cq, &wc) == 1, "completion of the receive");

	static char big[1 << 16];
	struct ibv_sge inl = { (uintptr_t)big, ia.cap.max_inline_data + 1, 0 };
	struct ibv_send_wr iw = { .wr_id = 2, .sg_list = &inl, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED };
	bad_wr = NULL;
	CHECK(ibv_post_send(a, &iw, &bad_wr) == EINVAL && bad_wr == &iw, "inline above max_inline_data");

	/* A WR naming a deregistered MR completes with a local protection error. */
	char *buf2 = calloc(1, 4096);
	struct ibv_mr *gone = ibv_reg_mr(pd, buf2, 4096, IBV_ACCESS_LOCAL_WRITE);
	uint32_t gone_lkey = gone->lkey;
	CHECK(ibv_dereg_mr(gone) == 0, "dereg");
	CHECK(ibv_dereg_mr(gone) == EINVAL, "dereg twice");
	struct ibv_sge gs = { (uintptr_t)buf2, 64, gone_lkey };
	struct ibv_send_wr gw = { .wr_id = 3, .sg_list = &gs, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = (uintptr_t)buf, .rkey = mr->rkey } };
	CHECK(ibv_post_send(a, &gw, &bad_wr) == 0, "post with a dead lkey is accepted");
	CHECK(poll_one(cq, &wc) == 1 && wc.wr_id == 3 && wc.status == IBV_WC_LOC_PROT_ERR,
	      "dead lkey: status %s", ibv_wc_status_str(wc.status));
	/* The QP is now in error: the next WR is flushed. */
	gw.wr_id = 4;
	gs.lkey = mr->lkey;
	if (ibv_post_send(a, &gw, &bad_wr) == 0)
		CHECK(poll_one(cq, &wc) == 1 && wc.status == IBV_WC_WR_FLUSH_ERR, "flushed: %s",
		      ibv_wc_status_str(wc.status));

	/* Remote access outside the MR. */
	struct ibv_send_wr rw = { .wr_id = 5, .sg_list = sges, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = (uintptr_t)buf + 65536, .rkey = mr->rkey } };
	struct ibv_cq *cq2 = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	ia.send_cq = ia.recv_cq = cq2;
	struct ibv_qp *c = ibv_create_qp(pd, &ia), *d = ibv_create_qp(pd, &ia);
	CHECK(connect_pair(c, d, gid) == 0, "connect 2");
	CHECK(ibv_post_send(c, &rw, &bad_wr) == 0, "post out-of-range write");
	CHECK(poll_one(cq2, &wc) == 1 && wc.wr_id == 5 && wc.status == IBV_WC_REM_ACCESS_ERR,
	      "out of range: %s", ibv_wc_status_str(wc.status));

	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "destroy_qp");
	CHECK(ibv_destroy_qp(a) == EINVAL, "destroy_qp twice");
	CHECK(ibv_destroy_qp(c) == 0 && ibv_destroy_qp(d) == 0, "destroy_qp 2");
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_cq(cq2) == 0, "destroy_cq");
	CHECK(ibv_destroy_cq(cq) == EINVAL, "destroy_cq twice");
	CHECK(ibv_dereg_mr(mr) == 0, "dereg");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "close");
	CHECK(ibv_close_device(ctx) == EINVAL, "close twice");
	ibv_free_device_list(list);
	printf("%d checks, %d failed\n", checks, failures);
	return failures != 0;
}
