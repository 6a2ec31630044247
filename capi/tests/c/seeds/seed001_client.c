/* From seed 001_1745ebbf8543d0a1.txt ("RDMA编程实例rdma_cm API"), 客户端client.c: the client of
 * the-geek-in-the-corner's 01_basic-client-server, as the seed prints it. The seed's code is kept
 * as it is, in its order (getaddrinfo, rdma_create_event_channel, rdma_create_id,
 * rdma_resolve_addr, the rdma_get_cm_event / rdma_ack_cm_event loop; on ADDR_RESOLVED
 * build_context (ibv_alloc_pd, ibv_create_comp_channel, ibv_create_cq, ibv_req_notify_cq, the CQ
 * poller thread), rdma_create_qp, ibv_reg_mr, ibv_post_recv, rdma_resolve_route; on
 * ROUTE_RESOLVED rdma_connect; on ESTABLISHED a SEND; after two completions rdma_disconnect; on
 * DISCONNECTED rdma_destroy_qp, ibv_dereg_mr, rdma_destroy_id), with these changes, each marked
 * "completed" where it is made:
 *  - <pthread.h> is included (the seed uses pthread_create without it);
 *  - the check: this client's message, "message from active/client side with pid N", is
 *    followed after its NUL by a known pattern up to BUFFER_SIZE bytes, which the server
 *    verifies; the server's message, received here, must be "message from passive/server side
 *    with pid N" followed by the same pattern, in a receive of BUFFER_SIZE bytes (the seed only
 *    printed it);
 *  - a connection the server refuses (REJECTED, UNREACHABLE, CONNECT_ERROR: it is not listening
 *    yet) exits with status 75 so that a test can start it again (the seed dies with "unknown
 *    event" for those); a receive flushed before the connection is established (librdmacm
 *    moves the QP to the error state when the connection fails) is left to that CM event;
 *    other failed completions print their status before the seed's die;
 *  - prints "seed001 client: OK" at the end if it verified the server's message.
 *
 * Usage: seed001_client <server-address> <server-port>     (the server: seed001_server PORT) */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h> /* completed */
#include <rdma/rdma_cma.h>

#define TEST_NZ(x) do { if ( (x)) die("error: " #x " failed (returned non-zero)." ); } while (0)
#define TEST_Z(x)  do { if (!(x)) die("error: " #x " failed (returned zero/null)."); } while (0)

const int BUFFER_SIZE = 1024;
const int TIMEOUT_IN_MS = 500; /* ms */

struct context {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_comp_channel *comp_channel;

  pthread_t cq_poller_thread;
};

struct connection {
  struct rdma_cm_id *id;
  struct ibv_qp *qp;

  struct ibv_mr *recv_mr;
  struct ibv_mr *send_mr;

  char *recv_region;
  char *send_region;

  int num_completions;
};

/* completed: what the server sends, and the check */
#define SERVER_PREFIX "message from passive/server side with pid "
static char pattern_byte(int i) { return (char)(i * 7 + 3); }
static void fill_pattern(char *region);
static void check_message(const char *region, const char *prefix, const char *who);
static int verified = 0;
static int connected = 0;

static void die(const char *reason);

static void build_context(struct ibv_context *verbs);
static void build_qp_attr(struct ibv_qp_init_attr *qp_attr);
static void * poll_cq(void *);
static void post_receives(struct connection *conn);
static void register_memory(struct connection *conn);

static int on_addr_resolved(struct rdma_cm_id *id);
static void on_completion(struct ibv_wc *wc);
static int on_connection(void *context);
static int on_disconnect(struct rdma_cm_id *id);
static int on_event(struct rdma_cm_event *event);
static int on_route_resolved(struct rdma_cm_id *id);

static struct context *s_ctx = NULL;

int main(int argc, char **argv)
{
  struct addrinfo *addr;
  struct rdma_cm_event *event = NULL;
  struct rdma_cm_id *conn= NULL;
  struct rdma_event_channel *ec = NULL;

  setvbuf(stdout, NULL, _IOLBF, 0); /* completed: line by line into a pipe */

  if (argc != 3)
    die("usage: client <server-address> <server-port>");

  TEST_NZ(getaddrinfo(argv[1], argv[2], NULL, &addr));

  TEST_Z(ec = rdma_create_event_channel());
  TEST_NZ(rdma_create_id(ec, &conn, NULL, RDMA_PS_TCP));
  TEST_NZ(rdma_resolve_addr(conn, NULL, addr->ai_addr, TIMEOUT_IN_MS));

  freeaddrinfo(addr);

  while (rdma_get_cm_event(ec, &event) == 0) {
    struct rdma_cm_event event_copy;

    memcpy(&event_copy, event, sizeof(*event));
    rdma_ack_cm_event(event);

    if (on_event(&event_copy))
      break;
  }

  rdma_destroy_event_channel(ec);

  /* completed: the verdict */
  if (!__atomic_load_n(&verified, __ATOMIC_SEQ_CST))
    die("seed001 client: the server's message was not verified.");
  printf("seed001 client: OK\n");

  return 0;
}

void die(const char *reason)
{
  fprintf(stderr, "%s\n", reason);
  exit(EXIT_FAILURE);
}

void build_context(struct ibv_context *verbs)
{
  if (s_ctx) {
    if (s_ctx->ctx != verbs)
      die("cannot handle events in more than one context.");

    return;
  }

  s_ctx = (struct context *)malloc(sizeof(struct context));

  s_ctx->ctx = verbs;

  TEST_Z(s_ctx->pd = ibv_alloc_pd(s_ctx->ctx));
  TEST_Z(s_ctx->comp_channel = ibv_create_comp_channel(s_ctx->ctx));
  TEST_Z(s_ctx->cq = ibv_create_cq(s_ctx->ctx, 10, NULL, s_ctx->comp_channel, 0)); /* cqe=10 is arbitrary */
  TEST_NZ(ibv_req_notify_cq(s_ctx->cq, 0));

  TEST_NZ(pthread_create(&s_ctx->cq_poller_thread, NULL, poll_cq, NULL));
}

void build_qp_attr(struct ibv_qp_init_attr *qp_attr)
{
  memset(qp_attr, 0, sizeof(*qp_attr));

  qp_attr->send_cq = s_ctx->cq;
  qp_attr->recv_cq = s_ctx->cq;
  qp_attr->qp_type = IBV_QPT_RC;

  qp_attr->cap.max_send_wr = 10;
  qp_attr->cap.max_recv_wr = 10;
  qp_attr->cap.max_send_sge = 1;
  qp_attr->cap.max_recv_sge = 1;
}

void * poll_cq(void *ctx)
{
  struct ibv_cq *cq;
  struct ibv_wc wc;

  while (1) {
    TEST_NZ(ibv_get_cq_event(s_ctx->comp_channel, &cq, &ctx));
    ibv_ack_cq_events(cq, 1);
    TEST_NZ(ibv_req_notify_cq(cq, 0));

    while (ibv_poll_cq(cq, 1, &wc))
      on_completion(&wc);
  }

  return NULL;
}

void post_receives(struct connection *conn)
{
  struct ibv_recv_wr wr, *bad_wr = NULL;
  struct ibv_sge sge;

  wr.wr_id = (uintptr_t)conn;
  wr.next = NULL;
  wr.sg_list = &sge;
  wr.num_sge = 1;

  sge.addr = (uintptr_t)conn->recv_region;
  sge.length = BUFFER_SIZE;
  sge.lkey = conn->recv_mr->lkey;

  TEST_NZ(ibv_post_recv(conn->qp, &wr, &bad_wr));
}

void register_memory(struct connection *conn)
{
  conn->send_region = malloc(BUFFER_SIZE);
  conn->recv_region = malloc(BUFFER_SIZE);

  TEST_Z(conn->send_mr = ibv_reg_mr(
    s_ctx->pd,
    conn->send_region,
    BUFFER_SIZE,
    0));

  TEST_Z(conn->recv_mr = ibv_reg_mr(
    s_ctx->pd,
    conn->recv_region,
    BUFFER_SIZE,
    IBV_ACCESS_LOCAL_WRITE));
}

int on_addr_resolved(struct rdma_cm_id *id)
{
  struct ibv_qp_init_attr qp_attr;
  struct connection *conn;

  printf("address resolved.\n");

  build_context(id->verbs);
  build_qp_attr(&qp_attr);

  TEST_NZ(rdma_create_qp(id, s_ctx->pd, &qp_attr));

  id->context = conn = (struct connection *)malloc(sizeof(struct connection));

  conn->id = id;
  conn->qp = id->qp;
  conn->num_completions = 0;

  register_memory(conn);
  post_receives(conn);

  TEST_NZ(rdma_resolve_route(id, TIMEOUT_IN_MS));

  return 0;
}

void on_completion(struct ibv_wc *wc)
{
  struct connection *conn = (struct connection *)(uintptr_t)wc->wr_id;

  if (wc->status != IBV_WC_SUCCESS) {
    /* completed: a receive flushed because the connection attempt failed (librdmacm moves the
     * QP to the error state on REJECTED) is not itself the error: the CM event says why */
    if (wc->status == IBV_WC_WR_FLUSH_ERR && !__atomic_load_n(&connected, __ATOMIC_SEQ_CST))
      return;
    fprintf(stderr, "on_completion: %s (opcode %d)\n", ibv_wc_status_str(wc->status),
            wc->opcode); /* completed */
    die("on_completion: status is not IBV_WC_SUCCESS.");
  }

  if (wc->opcode & IBV_WC_RECV) {
    /* completed: the whole buffer arrived, as sent */
    if (wc->byte_len != (uint32_t)BUFFER_SIZE)
      die("on_completion: the receive is not BUFFER_SIZE bytes.");
    check_message(conn->recv_region, SERVER_PREFIX, "seed001 client");
    printf("received message: %s\n", conn->recv_region);
  } else if (wc->opcode == IBV_WC_SEND)
    printf("send completed successfully.\n");
  else
    die("on_completion: completion isn't a send or a receive.");

  if (++conn->num_completions == 2)
    rdma_disconnect(conn->id);
}

/* completed: the check of a received message: PREFIX, a pid, the NUL, then the pattern */
void check_message(const char *region, const char *prefix, const char *who)
{
  size_t n = strlen(prefix);
  int i;

  if (strnlen(region, BUFFER_SIZE) == (size_t)BUFFER_SIZE || strncmp(region, prefix, n) != 0 ||
      atoi(region + n) <= 0) {
    fprintf(stderr, "%s: received \"%.100s\"\n", who, region);
    die("check_message: not the message that was sent.");
  }
  for (i = (int)strlen(region) + 1; i < BUFFER_SIZE; i++)
    if (region[i] != pattern_byte(i)) {
      fprintf(stderr, "%s: byte %d is %#x, sent %#x\n", who, i, (unsigned char)region[i],
              (unsigned char)pattern_byte(i));
      die("check_message: the bytes after the message differ from what was sent.");
    }
  printf("%s: the message and all %d bytes are as sent\n", who, BUFFER_SIZE);
  __atomic_store_n(&verified, 1, __ATOMIC_SEQ_CST);
}

/* completed: the bytes after the message */
void fill_pattern(char *region)
{
  int i;

  for (i = 0; i < BUFFER_SIZE; i++)
    region[i] = pattern_byte(i);
}

int on_connection(void *context)
{
  struct connection *conn = (struct connection *)context;
  struct ibv_send_wr wr, *bad_wr = NULL;
  struct ibv_sge sge;

  __atomic_store_n(&connected, 1, __ATOMIC_SEQ_CST); /* completed */
  fill_pattern(conn->send_region); /* completed */
  snprintf(conn->send_region, BUFFER_SIZE, "message from active/client side with pid %d", getpid());

  printf("connected. posting send...\n");

  memset(&wr, 0, sizeof(wr));

  wr.wr_id = (uintptr_t)conn;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;

  sge.addr = (uintptr_t)conn->send_region;
  sge.length = BUFFER_SIZE;
  sge.lkey = conn->send_mr->lkey;

  TEST_NZ(ibv_post_send(conn->qp, &wr, &bad_wr));

  return 0;
}

int on_disconnect(struct rdma_cm_id *id)
{
  struct connection *conn = (struct connection *)id->context;

  printf("disconnected.\n");

  rdma_destroy_qp(id);

  ibv_dereg_mr(conn->send_mr);
  ibv_dereg_mr(conn->recv_mr);

  free(conn->send_region);
  free(conn->recv_region);

  free(conn);

  rdma_destroy_id(id);

  return 1; /* exit event loop */
}

int on_event(struct rdma_cm_event *event)
{
  int r = 0;

  if (event->event == RDMA_CM_EVENT_ADDR_RESOLVED)
    r = on_addr_resolved(event->id);
  else if (event->event == RDMA_CM_EVENT_ROUTE_RESOLVED)
    r = on_route_resolved(event->id);
  else if (event->event == RDMA_CM_EVENT_ESTABLISHED)
    r = on_connection(event->id->context);
  else if (event->event == RDMA_CM_EVENT_DISCONNECTED)
    r = on_disconnect(event->id);
  else if (event->event == RDMA_CM_EVENT_REJECTED || event->event == RDMA_CM_EVENT_UNREACHABLE ||
           event->event == RDMA_CM_EVENT_CONNECT_ERROR) {
    /* completed: nobody listens there (yet): a distinct status, for a retry */
    fprintf(stderr, "on_event: %s (status %d): server not listening\n",
            rdma_event_str(event->event), event->status);
    exit(75);
  } else
    die("on_event: unknown event.");

  return r;
}

int on_route_resolved(struct rdma_cm_id *id)
{
  struct rdma_conn_param cm_params;

  printf("route resolved.\n");

  memset(&cm_params, 0, sizeof(cm_params));
  TEST_NZ(rdma_connect(id, &cm_params));

  return 0;
}
