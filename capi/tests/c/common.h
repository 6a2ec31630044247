/* Shared by the C test programs: a check macro and two RC QPs of one process connected to
 * each other over the first GID. */
#ifndef SOFTRDMA_TEST_COMMON_H
#define SOFTRDMA_TEST_COMMON_H
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

static int checks, failures;

#define CHECK(cond, ...)                                                     \
	do {                                                                 \
		checks++;                                                    \
		if (!(cond)) {                                               \
			failures++;                                          \
			printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			printf(__VA_ARGS__);                                 \
			printf("\n");                                        \
		}                                                            \
	} while (0)

__attribute__((unused)) static int connect_pair(struct ibv_qp *a, struct ibv_qp *b, union ibv_gid gid)
{
	struct ibv_qp *qps[2] = {a, b};
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr attr = {
			.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
			.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
					   IBV_ACCESS_REMOTE_ATOMIC,
		};
		if (ibv_modify_qp(qps[i], &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_ACCESS_FLAGS))
			return -1;
	}
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr attr = {
			.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
			.dest_qp_num = qps[1 - i]->qp_num, .rq_psn = 0,
			.max_dest_rd_atomic = 1, .min_rnr_timer = 12,
			.ah_attr = { .is_global = 1, .port_num = 1,
				     .grh = { .dgid = gid, .sgid_index = 0, .hop_limit = 1 } },
		};
		if (ibv_modify_qp(qps[i], &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER))
			return -2;
		attr.qp_state = IBV_QPS_RTS;
		attr.timeout = 14;
		attr.retry_cnt = 7;
		attr.rnr_retry = 7;
		attr.sq_psn = 0;
		attr.max_rd_atomic = 1;
		if (ibv_modify_qp(qps[i], &attr, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
			return -3;
	}
	return 0;
}

__attribute__((unused)) static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (long spins = 0; spins < 200000000L; spins++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
	}
	return 0;
}

#endif
