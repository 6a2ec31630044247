/* From seed 001_1745ebbf8543d0a1.txt ("RDMA编程实例rdma_cm API"), 服务端server.c: the server of
 * the-geek-in-the-corner's 01_basic-client-server, as the seed prints it. The seed's code is kept
 * as it is, in its order (rdma_create_event_channel, rdma_create_id, rdma_bind_addr, rdma_listen,
 * the rdma_get_cm_event / rdma_ack_cm_event loop; on CONNECT_REQUEST build_context
 * (ibv_alloc_pd, ibv_create_comp_channel, ibv_create_cq, ibv_req_notify_cq, the CQ poller
 * thread), rdma_create_qp, ibv_reg_mr, ibv_post_recv, rdma_accept; on ESTABLISHED a SEND; on
 * DISCONNECTED rdma_destroy_qp, ibv_dereg_mr, rdma_destroy_id), with these changes, each marked
 * "completed" where it is made:
 *  - the seed's line "TEST_NZ(ibv_req_notify_cq(s_ctx->cq, 0)); #完成完成队列与完成通道的关联"
 *    does not compile: its comment is made a C comment; <pthread.h> is included;
 *  - a port argument (the seed binds port 0 and prints the port it got; without an argument
 *    this server still does);
 *  - the check: the client sends "message from active/client side with pid N" followed, after
 *    the NUL, by a known pattern up to BUFFER_SIZE bytes; the receive completion must be a
 *    receive of BUFFER_SIZE bytes carrying exactly that (the seed only printed it). This
 *    server's own message carries the same pattern, which the client checks;
 *  - the send's wr_id names the connection, as in the seed's client, so that on_completion can
 *    count both completions; on_disconnect waits until both were seen (the CQ poller thread may
 *    still be handling them when DISCONNECTED arrives), then tears down as the seed does;
 *  - the seed's server serves forever (on_disconnect returns 0); this one exits after its
 *    client disconnects, printing "seed001 server: OK" if it verified the client's message.
 *
 * Usage: seed001_server [PORT]     (the client: seed001_client HOST PORT) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h> /* completed */
#include <rdma/rdma_cma.h>

#define TEST_NZ(x) do { if ( (x)) die("error: " #x " failed (returned non-zero)." ); } while (0)
#define TEST_Z(x)  do { if (!(x)) die("error: " #x " failed (returned zero/null)."); } while (0)

const int BUFFER_SIZE = 1024;

struct context {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_comp_channel *comp_channel;

  pthread_t cq_poller_thread;
};

struct connection {
  struct ibv_qp *qp;

  struct ibv_mr *recv_mr;
  struct ibv_mr *send_mr;

  char *recv_region;
  char *send_region;

  /* completed: both completions counted, under lock, for on_disconnect */
  int num_completions;
  pthread_mutex_t lock;
  pthread_cond_t cond;
};

/* completed: what the client sends, and the check */
#define CLIENT_PREFIX "message from active/client side with pid "
static char pattern_byte(int i) { return (char)(i * 7 + 3); }
static void fill_pattern(char *region);
static void check_message(const char *region, const char *prefix, const char *who);
static int verified = 0;

static void die(const char *reason);

static void build_context(struct ibv_context *verbs);
static void build_qp_attr(struct ibv_qp_init_attr *qp_attr);
static void * poll_cq(void *);
static void post_receives(struct connection *conn);
static void register_memory(struct connection *conn);

static void on_completion(struct ibv_wc *wc);
static int on_connect_request(struct rdma_cm_id *id);
static int on_connection(void *context);
static int on_disconnect(struct rdma_cm_id *id);
static int on_event(struct rdma_cm_event *event);

static struct context *s_ctx = NULL;

int main(int argc, char **argv)
{
#if _USE_IPV6
  struct sockaddr_in6 addr;
#else
  struct sockaddr_in addr;
#endif
  struct rdma_cm_event *event = NULL;
  struct rdma_cm_id *listener = NULL;
  struct rdma_event_channel *ec = NULL;
  uint16_t port = 0;

  setvbuf(stdout, NULL, _IOLBF, 0); /* completed: line by line into a pipe */
  if (argc > 1) /* completed: the port to listen on */
    port = (uint16_t)atoi(argv[1]);

  memset(&addr, 0, sizeof(addr));
#if _USE_IPV6
  addr.sin6_family = AF_INET6;
  addr.sin6_port = htons(port);
#else
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
#endif

  TEST_Z(ec = rdma_create_event_channel());
  TEST_NZ(rdma_create_id(ec, &listener, NULL, RDMA_PS_TCP));
  TEST_NZ(rdma_bind_addr(listener, (struct sockaddr *)&addr));
  TEST_NZ(rdma_listen(listener, 10)); /* backlog=10 is arbitrary */

  port = ntohs(rdma_get_src_port(listener)); //rdma_get_src_port 返回listener对应的tcp 端口

  printf("listening on port %d.\n", port);

  while (rdma_get_cm_event(ec, &event) == 0) {
    struct rdma_cm_event event_copy;

    memcpy(&event_copy, event, sizeof(*event));
    rdma_ack_cm_event(event);

    if (on_event(&event_copy))
      break;
  }

  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ec);

  /* completed: the verdict */
  if (!__atomic_load_n(&verified, __ATOMIC_SEQ_CST))
    die("seed001 server: no message was verified.");
  printf("seed001 server: OK\n");

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
  TEST_NZ(ibv_req_notify_cq(s_ctx->cq, 0)); /* 完成完成队列与完成通道的关联 */

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

void on_completion(struct ibv_wc *wc)
{
  if (wc->status != IBV_WC_SUCCESS) {
    fprintf(stderr, "on_completion: %s (opcode %d)\n", ibv_wc_status_str(wc->status),
            wc->opcode); /* completed */
    die("on_completion: status is not IBV_WC_SUCCESS.");
  }

  struct connection *conn = (struct connection *)(uintptr_t)wc->wr_id; /* completed: both */

  if (wc->opcode & IBV_WC_RECV) {
    /* completed: the whole buffer arrived, as sent */
    if (wc->byte_len != (uint32_t)BUFFER_SIZE)
      die("on_completion: the receive is not BUFFER_SIZE bytes.");
    check_message(conn->recv_region, CLIENT_PREFIX, "seed001 server");

    printf("received message: %s\n", conn->recv_region);

  } else if (wc->opcode == IBV_WC_SEND) {
    printf("send completed successfully.\n");
  } else
    die("on_completion: completion isn't a send or a receive."); /* completed */

  /* completed: count it; on_disconnect waits for both */
  pthread_mutex_lock(&conn->lock);
  conn->num_completions++;
  pthread_cond_signal(&conn->cond);
  pthread_mutex_unlock(&conn->lock);
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

int on_connect_request(struct rdma_cm_id *id)
{
  struct ibv_qp_init_attr qp_attr;
  struct rdma_conn_param cm_params;
  struct connection *conn;

  printf("received connection request.\n");

  build_context(id->verbs);
  build_qp_attr(&qp_attr);

  TEST_NZ(rdma_create_qp(id, s_ctx->pd, &qp_attr));

  id->context = conn = (struct connection *)malloc(sizeof(struct connection));
  conn->qp = id->qp;
  conn->num_completions = 0; /* completed */
  pthread_mutex_init(&conn->lock, NULL);
  pthread_cond_init(&conn->cond, NULL);

  register_memory(conn);
  post_receives(conn);

  memset(&cm_params, 0, sizeof(cm_params));
  TEST_NZ(rdma_accept(id, &cm_params));

  return 0;
}

int on_connection(void *context)
{
  struct connection *conn = (struct connection *)context;
  struct ibv_send_wr wr, *bad_wr = NULL;
  struct ibv_sge sge;

  fill_pattern(conn->send_region); /* completed */
  snprintf(conn->send_region, BUFFER_SIZE, "message from passive/server side with pid %d", getpid());

  printf("connected. posting send...\n");

  memset(&wr, 0, sizeof(wr));

  wr.wr_id = (uintptr_t)conn; /* completed, as in the seed's client */
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

  printf("peer disconnected.\n");

  /* completed: the CQ poller thread has handled both completions */
  pthread_mutex_lock(&conn->lock);
  while (conn->num_completions < 2)
    pthread_cond_wait(&conn->cond, &conn->lock);
  pthread_mutex_unlock(&conn->lock);

  rdma_destroy_qp(id);

  ibv_dereg_mr(conn->send_mr);
  ibv_dereg_mr(conn->recv_mr);

  free(conn->send_region);
  free(conn->recv_region);

  free(conn);

  rdma_destroy_id(id);

  return 1; /* completed: exit event loop after one client (the seed returns 0: serve on) */
}

int on_event(struct rdma_cm_event *event)
{
  int r = 0;

  if (event->event == RDMA_CM_EVENT_CONNECT_REQUEST)
    r = on_connect_request(event->id);
  else if (event->event == RDMA_CM_EVENT_ESTABLISHED)
    r = on_connection(event->id->context);
  else if (event->event == RDMA_CM_EVENT_DISCONNECTED)
    r = on_disconnect(event->id);
  else
    die("on_event: unknown event.");

  return r;
}
