/* The extended verbs a program reaches through struct verbs_context: ibv_query_device_ex,
 * ibv_query_port (the header's inline one), ibv_query_gid_ex, ibv_create_cq_ex with the
 * ibv_start_poll/ibv_next_poll/ibv_wc_read_* API, and ibv_create_qp_ex + ibv_qp_to_qp_ex with
 * the ibv_wr_* post API (SGE, inline data, immediate data, RDMA WRITE, READ and atomics). */
#include <arpa/inet.h>
#include "common.h"

static int poll_ex(struct ibv_cq_ex *cq, uint64_t *wr_id, enum ibv_wc_status *st,
		   enum ibv_wc_opcode *op, uint32_t *len, uint32_t *imm, uint32_t *flags)
{
	struct ibv_poll_cq_attr pa = {0};
	for (long spins = 0; spins < 200000000L; spins++) {
		int r = ibv_start_poll(cq, &pa);
		if (r == ENOENT)
			continue;
		if (r)
			return -1;
		*wr_id = cq->wr_id;
		*st = cq->status;
		*op = ibv_wc_read_opcode(cq);
		*len = ibv_wc_read_byte_len(cq);
		*flags = ibv_wc_read_wc_flags(cq);
		*imm = (*flags & IBV_WC_WITH_IMM) ? ntohl(ibv_wc_read_imm_data(cq)) : 0;
		ibv_end_poll(cq);
		return 1;
	}
	return 0;
}

int main(void)
{
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL, "open");

	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0, "query_device_ex");
	CHECK(dx.orig_attr.max_qp > 0 && dx.orig_attr.phys_port_cnt == 1, "device attrs");
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
	      pa.link_layer == IBV_LINK_LAYER_ETHERNET, "query_port");
	struct ibv_gid_entry ge;
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2,
	      "query_gid_ex");
	union ibv_gid gid;
	ibv_query_gid(ctx, 1, 0, &gid);
	CHECK(memcmp(&gid, &ge.gid, 16) == 0, "query_gid_ex agrees with query_gid");

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq_init_attr_ex ca = {
		.cqe = 64, .wc_flags = IBV_WC_STANDARD_FLAGS,
	};
	struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &ca);
	CHECK(cq != NULL, "create_cq_ex: errno %d", errno);
	struct ibv_cq_init_attr_ex ts = ca;
	ts.wc_flags |= IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &ts) == NULL && errno == EOPNOTSUPP, "timestamps: errno %d", errno);

	struct ibv_qp_init_attr_ex qa = {
		.send_cq = ibv_cq_ex_to_cq(cq), .recv_cq = ibv_cq_ex_to_cq(cq), .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
				  IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
				  IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
	};
	struct ibv_qp *a = ibv_create_qp_ex(ctx, &qa), *b = ibv_create_qp_ex(ctx, &qa);
	CHECK(a && b, "create_qp_ex: errno %d", errno);
	CHECK(connect_pair(a, b, gid) == 0, "connect");
	struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a);
	CHECK(ax != NULL, "qp_to_qp_ex");

	uint64_t *mem = aligned_alloc(4096, 8192);
	memset(mem, 0, 8192);
	struct ibv_mr *mr = ibv_reg_mr(pd, mem, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	char *bytes = (char *)mem;
	struct ibv_sge rs = { (uintptr_t)(bytes + 4096), 256, mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 100, .sg_list = &rs, .num_sge = 1 }, *brw;
	CHECK(ibv_post_recv(b, &rw, &brw) == 0, "post_recv");

	/* SEND_WITH_IMM of inline data, then a WRITE from an SGE, a READ back, two atomics. */
	const char msg[] = "inline hello";
	strcpy(bytes + 1024, "written by sge");
	ibv_wr_start(ax);
	ax->wr_id = 1;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(ax, htonl(0xabcd1234));
	ibv_wr_set_inline_data(ax, (void *)msg, sizeof msg);
	ax->wr_id = 2;
	ibv_wr_rdma_write(ax, mr->rkey, (uintptr_t)(bytes + 2048));
	ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)(bytes + 1024), 15);
	ax->wr_id = 3;
	ibv_wr_rdma_read(ax, mr->rkey, (uintptr_t)(bytes + 2048));
	ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)(bytes + 3072), 15);
	ax->wr_id = 4;
	mem[7] = 40;
	ibv_wr_atomic_fetch_add(ax, mr->rkey, (uintptr_t)&mem[7], 2);
	ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)&mem[8], 8);
	ax->wr_id = 5;
	ibv_wr_atomic_cmp_swp(ax, mr->rkey, (uintptr_t)&mem[7], 42, 99);
	ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)&mem[9], 8);
	CHECK(ibv_wr_complete(ax) == 0, "wr_complete");

	int seen = 0;
	for (int i = 0; i < 6; i++) {
		uint64_t id; enum ibv_wc_status st; enum ibv_wc_opcode op; uint32_t len, imm, fl;
		if (poll_ex(cq, &id, &st, &op, &len, &imm, &fl) != 1) {
			CHECK(0, "completion %d missing", i);
			break;
		}
		CHECK(st == IBV_WC_SUCCESS, "wr %lu: %s", (unsigned long)id, ibv_wc_status_str(st));
		seen |= 1 << (id == 100 ? 0 : id);
		if (id == 100) {
			CHECK(op == IBV_WC_RECV && len == sizeof msg && (fl & IBV_WC_WITH_IMM) &&
			      imm == 0xabcd1234, "recv: op %d len %u imm %x", op, len, imm);
			CHECK(strcmp(bytes + 4096, msg) == 0, "inline payload");
		}
	}
	CHECK(seen == 0x3f, "all six completions: %x", seen);
	CHECK(memcmp(bytes + 2048, "written by sge", 15) == 0, "WRITE landed");
	CHECK(memcmp(bytes + 3072, "written by sge", 15) == 0, "READ came back");
	CHECK(mem[8] == 40 && mem[9] == 42 && mem[7] == 99, "atomics: %lu %lu %lu",
	      (unsigned long)mem[8], (unsigned long)mem[9], (unsigned long)mem[7]);

	/* An opcode the QP was not created for is refused at wr_complete, nothing posted. */
	ibv_wr_start(ax);
	ax->wr_id = 9;
	ibv_wr_set_inline_data(ax, (void *)msg, 4); /* no WR yet */
	CHECK(ibv_wr_complete(ax) == EINVAL, "data before a WR");

	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0, "destroy_cq");
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("%d checks, %d failed\n", checks, failures);
	return failures != 0;
}
