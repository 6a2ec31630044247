/* librdmacm's API as a program sees it, one process on the loopback device: addresses,
 * devices, the fields of rdma_cm_id, events with their parameters and private data both ways,
 * QPs created by rdma_create_qp, reject, disconnect, non-blocking channels, options, errors.
 * Built against the installed rdma-core headers and run on softrdma's librdmacm.so.1 by
 * tests/rdmacm_tools.rs. Usage: rdmacm_api PORT1 PORT2 PORT3. */
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		checks++;                                                  \
		if (!(cond)) {                                             \
			printf("FAIL line %d: %s: ", __LINE__, #cond);     \
			printf(__VA_ARGS__);                               \
			printf(" (errno %d %s)\n", errno, strerror(errno)); \
			exit(1);                                           \
		}                                                          \
	} while (0)

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type t)
{
	struct rdma_cm_event *ev;
	int r = rdma_get_cm_event(ch, &ev);

	CHECK(r == 0, "rdma_get_cm_event");
	CHECK(ev->event == t, "got %s (status %d), wanted %s", rdma_event_str(ev->event),
	      ev->status, rdma_event_str(t));
	return ev;
}

static struct sockaddr_in v4(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };

	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

static void test_strings(void)
{
	CHECK(!strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED"), "str");
	CHECK(!strcmp(rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT), "RDMA_CM_EVENT_TIMEWAIT_EXIT"),
	      "str");
	CHECK(!strcmp(rdma_event_str(RDMA_CM_EVENT_ADDR_CHANGE), "RDMA_CM_EVENT_ADDR_CHANGE"), "str");
	CHECK(!strcmp(rdma_event_str(99), "UNKNOWN EVENT"), "str");
}

static void test_getaddrinfo(const char *port)
{
	struct rdma_addrinfo hints = {}, *res;
	struct sockaddr_in *sin;

	hints.ai_flags = RAI_NUMERICHOST;
	hints.ai_port_space = RDMA_PS_TCP;
	CHECK(rdma_getaddrinfo("127.0.0.1", port, &hints, &res) == 0, "getaddrinfo");
	CHECK(res->ai_dst_addr && res->ai_dst_len == sizeof(struct sockaddr_in), "dst");
	sin = (struct sockaddr_in *)res->ai_dst_addr;
	CHECK(sin->sin_family == AF_INET && ntohs(sin->sin_port) == atoi(port), "dst port");
	CHECK(sin->sin_addr.s_addr == htonl(0x7f000001), "dst addr");
	CHECK(res->ai_port_space == RDMA_PS_TCP && res->ai_qp_type == IBV_QPT_RC, "ps/qp type");
	CHECK(!(res->ai_flags & RAI_PASSIVE) && !res->ai_src_addr, "active");
	rdma_freeaddrinfo(res);

	/* No hints: the first answer (stream, TCP) decides: RC in the TCP port space. */
	CHECK(rdma_getaddrinfo("127.0.0.1", port, NULL, &res) == 0, "getaddrinfo no hints");
	CHECK(res->ai_port_space == RDMA_PS_TCP && res->ai_qp_type == IBV_QPT_RC, "defaults");
	rdma_freeaddrinfo(res);

	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_UDP;
	CHECK(rdma_getaddrinfo(NULL, port, &hints, &res) == 0, "passive");
	CHECK((res->ai_flags & RAI_PASSIVE) && res->ai_src_addr && !res->ai_dst_addr, "src");
	CHECK(res->ai_port_space == RDMA_PS_UDP && res->ai_qp_type == IBV_QPT_UD, "udp");
	rdma_freeaddrinfo(res);

	hints.ai_flags = RAI_NUMERICHOST;
	CHECK(rdma_getaddrinfo("not-a-number", port, &hints, &res) == EAI_NONAME, "EAI_NONAME");
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL, "EINVAL");
}

static void test_devices(void)
{
	int n = -1, i;
	struct ibv_context **list = rdma_get_devices(&n);
	struct ibv_device_attr attr;

	CHECK(list && n > 0, "rdma_get_devices");
	for (i = 0; i < n; i++) {
		CHECK(list[i] != NULL, "entry %d", i);
		CHECK(ibv_query_device(list[i], &attr) == 0, "query %d", i);
	}
	CHECK(list[n] == NULL, "NULL-terminated");
	rdma_free_devices(list);
}

static void test_errors(struct rdma_event_channel *ch)
{
	struct sockaddr_in a = v4("127.0.0.1", 1);
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons(1) };
	struct rdma_cm_id *id;
	struct rdma_cm_event *ev;
	int v = 1;

	errno = 0;
	CHECK(rdma_bind_addr(NULL, (struct sockaddr *)&a) == -1 && errno == EINVAL, "NULL id");
	errno = 0;
	CHECK(rdma_ack_cm_event(NULL) == -1 && errno == EINVAL, "NULL event");
	errno = 0;
	CHECK(rdma_get_cm_event(NULL, &ev) == -1 && errno == EINVAL, "NULL channel");
	errno = 0;
	CHECK(rdma_destroy_id(NULL) == -1 && errno == EINVAL, "destroy NULL");
	errno = 0;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create");
	CHECK(rdma_listen(id, 0) == -1 && errno == EINVAL, "listen unbound");
	CHECK(rdma_connect(id, NULL) == -1 && errno == EINVAL, "connect unresolved, no QP");
	inet_pton(AF_INET6, "2001:db8::1", &a6.sin6_addr);
	errno = 0;
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&a6) == -1 && errno == EADDRNOTAVAIL,
	      "an IPv6 address of no interface: %s", strerror(errno));
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &v, sizeof(v)) == 0,
	      "REUSEADDR");
	errno = 0;
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, 77, &v, sizeof(v)) == -1 && errno == ENOSYS,
	      "unknown option");
	CHECK(rdma_destroy_id(id) == 0, "destroy");
	errno = 0;
	CHECK(rdma_destroy_id(id) == -1 && errno == EINVAL, "destroyed twice");
	errno = 0;
	CHECK(rsocket(AF_INET, SOCK_STREAM, 0) == -1 && errno == ENOSYS, "rsocket");
}

/* Connects `client` to the listener (both on `ch`), private data both ways. Returns the
 * server's id of the connection. */
static struct rdma_cm_id *connect_pair(struct rdma_event_channel *ch, struct rdma_cm_id *listen,
				       struct rdma_cm_id *client, struct sockaddr *dst)
{
	struct rdma_conn_param cp = {};
	struct rdma_cm_event *ev;
	struct rdma_cm_id *child;
	struct ibv_qp_init_attr qa = {};
	uint32_t client_qpn, child_qpn;

	CHECK(rdma_resolve_addr(client, NULL, dst, 2000) == 0, "resolve_addr");
	ev = expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(ev->id == client && ev->status == 0, "event id");
	CHECK(client->verbs != NULL && client->pd != NULL && client->port_num == 1,
	      "verbs after resolve");
	rdma_ack_cm_event(ev);
	CHECK(rdma_resolve_route(client, 2000) == 0, "resolve_route");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	CHECK(client->route.num_paths == 1 && client->route.path_rec, "path");

	/* NULL PD and CQs: librdmacm's defaults. */
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.qp_type = IBV_QPT_RC;
	CHECK(rdma_create_qp(client, NULL, &qa) == 0, "create_qp");
	CHECK(client->qp && client->qp->pd == client->pd, "qp/pd");
	CHECK(client->send_cq && client->recv_cq && client->send_cq_channel &&
	      client->recv_cq_channel, "CQs and channels made");
	CHECK(qa.send_cq == client->send_cq && qa.cap.max_send_wr >= 4, "attr back");
	CHECK(client->qp->state == IBV_QPS_INIT, "QP in INIT");
	client_qpn = client->qp->qp_num;

	cp.private_data = "hello";
	cp.private_data_len = 6;
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	CHECK(rdma_connect(client, &cp) == 0, "connect");

	ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	child = ev->id;
	CHECK(ev->listen_id == listen && child != listen && child != client, "new id");
	CHECK(child->context == listen->context && child->channel == ch, "inherited");
	CHECK(child->verbs == client->verbs, "one ibv_context per device: %p %p",
	      (void *)child->verbs, (void *)client->verbs);
	CHECK(ev->param.conn.private_data_len >= 6 &&
	      !memcmp(ev->param.conn.private_data, "hello", 6), "private data in");
	CHECK(ev->param.conn.qp_num == client_qpn, "peer QPN %u %u", ev->param.conn.qp_num,
	      client_qpn);
	CHECK(rdma_get_dst_port(child) == rdma_get_src_port(client), "ports");
	CHECK(rdma_get_src_port(child) == rdma_get_src_port(listen), "listener port");
	rdma_ack_cm_event(ev);

	memset(&qa, 0, sizeof(qa));
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.qp_type = IBV_QPT_RC;
	CHECK(rdma_create_qp(child, NULL, &qa) == 0, "create_qp child");
	child_qpn = child->qp->qp_num;
	memset(&cp, 0, sizeof(cp));
	cp.private_data = "world";
	cp.private_data_len = 6;
	cp.responder_resources = RDMA_MAX_RESP_RES;
	cp.initiator_depth = RDMA_MAX_INIT_DEPTH;
	cp.rnr_retry_count = 7;
	CHECK(rdma_accept(child, &cp) == 0, "accept");

	/* Both sides: ESTABLISHED, in either order. */
	for (int i = 0; i < 2; i++) {
		ev = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
		if (ev->id == client) {
			CHECK(ev->param.conn.private_data_len >= 6 &&
			      !memcmp(ev->param.conn.private_data, "world", 6), "private data back");
			CHECK(ev->param.conn.qp_num == child_qpn, "server QPN");
		} else {
			CHECK(ev->id == child, "established id");
		}
		rdma_ack_cm_event(ev);
	}
	return child;
}

static void disconnect_pair(struct rdma_event_channel *ch, struct rdma_cm_id *a,
			    struct rdma_cm_id *b)
{
	struct rdma_cm_event *ev;
	int seen_a = 0, seen_b = 0;

	CHECK(rdma_disconnect(a) == 0, "disconnect");
	while (!(seen_a && seen_b)) {
		ev = expect(ch, RDMA_CM_EVENT_DISCONNECTED);
		if (ev->id == a)
			seen_a = 1;
		else if (ev->id == b) {
			seen_b = 1;
			/* The passive side answers the DREQ. */
		}
		rdma_ack_cm_event(ev);
		if (seen_b && !seen_a)
			rdma_disconnect(b);
	}
	rdma_destroy_qp(a);
	rdma_destroy_qp(b);
	CHECK(a->qp == NULL && a->send_cq == NULL, "destroy_qp clears the id");
	CHECK(rdma_destroy_id(a) == 0 && rdma_destroy_id(b) == 0, "destroy ids");
}

static void test_connection(struct rdma_event_channel *ch, int port, int v6)
{
	struct rdma_cm_id *listen, *client, *child;
	struct sockaddr_in a = v4("127.0.0.1", port);
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons(port) };
	struct sockaddr_in dst = v4("127.0.0.1", port);
	int ctx_tag;
	uint8_t tos = 32;

	CHECK(rdma_create_id(ch, &listen, &ctx_tag, RDMA_PS_TCP) == 0, "create listen");
	CHECK(listen->context == &ctx_tag && listen->channel == ch && listen->ps == RDMA_PS_TCP &&
	      listen->qp_type == IBV_QPT_RC, "fields");
	if (v6) {
		/* The IPv6 wildcard takes IPv4 peers, as on Linux. */
		CHECK(rdma_bind_addr(listen, (struct sockaddr *)&a6) == 0, "bind ::");
		CHECK(listen->route.addr.src_addr.sa_family == AF_INET6, "v6 family");
	} else {
		CHECK(rdma_bind_addr(listen, (struct sockaddr *)&a) == 0, "bind");
		CHECK(listen->verbs != NULL, "bound to a device");
		CHECK(listen->route.addr.src_sin.sin_family == AF_INET &&
		      listen->route.addr.src_sin.sin_addr.s_addr == htonl(0x7f000001), "src addr");
	}
	CHECK(ntohs(rdma_get_src_port(listen)) == port, "src port");
	CHECK(rdma_listen(listen, 4) == 0, "listen");
	CHECK(rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0, "create client");
	CHECK(rdma_set_option(client, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0, "TOS");
	child = connect_pair(ch, listen, client, (struct sockaddr *)&dst);
	CHECK(client->route.addr.dst_sin.sin_addr.s_addr == htonl(0x7f000001) &&
	      ntohs(client->route.addr.dst_sin.sin_port) == port, "dst addr");
	/* As Linux's: an IPv4 peer's connection has AF_INET addresses, whatever the listener's. */
	CHECK(child->route.addr.dst_addr.sa_family == AF_INET &&
	      child->route.addr.src_addr.sa_family == AF_INET, "child of an IPv4 peer is AF_INET");
	disconnect_pair(ch, client, child);
	CHECK(rdma_destroy_id(listen) == 0, "destroy listen");
}

/* RoCEv2 over IPv6: a listener on ::1 and a client resolving [::1]. */
static void test_connection_ipv6(struct rdma_event_channel *ch, int port)
{
	struct rdma_cm_id *listen, *client, *child;
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons(port) };
	union ibv_gid gid;

	inet_pton(AF_INET6, "::1", &a6.sin6_addr);
	CHECK(rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) == 0, "create listen");
	if (rdma_bind_addr(listen, (struct sockaddr *)&a6)) {
		printf("rdmacm_api: no ::1 here (%s): IPv6 connection not checked\n",
		       strerror(errno));
		rdma_destroy_id(listen);
		return;
	}
	CHECK(listen->verbs != NULL, "::1 is on a device");
	CHECK(listen->route.addr.src_sin6.sin6_family == AF_INET6 &&
	      IN6_IS_ADDR_LOOPBACK(&listen->route.addr.src_sin6.sin6_addr), "src ::1");
	CHECK(rdma_listen(listen, 4) == 0, "listen ::1");
	CHECK(rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0, "create client");
	child = connect_pair(ch, listen, client, (struct sockaddr *)&a6);
	CHECK(client->route.addr.dst_sin6.sin6_family == AF_INET6 &&
	      IN6_IS_ADDR_LOOPBACK(&client->route.addr.dst_sin6.sin6_addr) &&
	      ntohs(client->route.addr.dst_sin6.sin6_port) == port, "client dst [::1]");
	CHECK(client->route.addr.src_sin6.sin6_family == AF_INET6 &&
	      IN6_IS_ADDR_LOOPBACK(&client->route.addr.src_sin6.sin6_addr), "client src ::1");
	CHECK(child->route.addr.dst_sin6.sin6_family == AF_INET6 &&
	      IN6_IS_ADDR_LOOPBACK(&child->route.addr.dst_sin6.sin6_addr), "child dst ::1");
	/* The GIDs are the IPv6 address itself, not IPv4-mapped. */
	CHECK(IN6_IS_ADDR_LOOPBACK((struct in6_addr *)client->route.addr.addr.ibaddr.sgid.raw) &&
	      IN6_IS_ADDR_LOOPBACK((struct in6_addr *)client->route.addr.addr.ibaddr.dgid.raw),
	      "GIDs ::1");
	CHECK(ibv_query_gid(client->verbs, 1, 0, &gid) == 0, "query gid");
	disconnect_pair(ch, client, child);
	CHECK(rdma_destroy_id(listen) == 0, "destroy listen ::1");
}

static void test_reject_and_nonblocking(struct rdma_event_channel *ch, int port)
{
	struct rdma_cm_id *listen, *client, *child;
	struct sockaddr_in a = v4("127.0.0.1", port);
	struct rdma_cm_event *ev;
	struct ibv_qp_init_attr qa = {};
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	struct ibv_qp_attr attr = {};
	int fl, mask;

	CHECK(rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) == 0, "create");
	CHECK(rdma_bind_addr(listen, (struct sockaddr *)&a) == 0, "bind");
	CHECK(rdma_listen(listen, 0) == 0, "listen");

	fl = fcntl(ch->fd, F_GETFL);
	CHECK(fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK");
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN, "EAGAIN when empty");
	CHECK(rpoll(&pfd, 1, 0) == 0, "nothing to poll");

	CHECK(rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0, "create");
	CHECK(rdma_resolve_addr(client, NULL, (struct sockaddr *)&a, 2000) == 0, "resolve");
	CHECK(rpoll(&pfd, 1, 5000) == 1 && (pfd.revents & POLLIN), "rpoll sees the event");
	CHECK(rdma_get_cm_event(ch, &ev) == 0 && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED, "ev");
	rdma_ack_cm_event(ev);
	CHECK(fcntl(ch->fd, F_SETFL, fl) == 0, "blocking again");

	CHECK(rdma_resolve_route(client, 2000) == 0, "route");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.qp_type = IBV_QPT_RC;
	attr.qp_state = IBV_QPS_RTR;
	errno = 0;
	CHECK(rdma_init_qp_attr(client, &attr, &mask) == -1 && errno == EINVAL,
	      "RTR attributes before the connection");
	attr.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(client, &attr, &mask) == 0 && attr.port_num == 1 &&
	      (mask & IBV_QP_ACCESS_FLAGS), "INIT attributes");
	CHECK(rdma_create_qp(client, NULL, &qa) == 0, "qp");
	errno = 0;
	CHECK(rdma_establish(client) == -1 && errno == EINVAL, "establish with a QP");
	CHECK(rdma_connect(client, NULL) == 0, "connect without parameters");
	ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	child = ev->id;
	CHECK(rdma_reject(child, "no", 3) == 0, "reject");
	rdma_ack_cm_event(ev);
	CHECK(rdma_destroy_id(child) == 0, "destroy the rejected id");
	ev = expect(ch, RDMA_CM_EVENT_REJECTED);
	CHECK(ev->id == client && ev->status == 28, "consumer reject, status %d", ev->status);
	CHECK(ev->param.conn.private_data_len >= 3 && !memcmp(ev->param.conn.private_data, "no", 3),
	      "reject private data");
	rdma_ack_cm_event(ev);
	rdma_destroy_qp(client);
	CHECK(rdma_destroy_id(client) == 0, "destroy");
	CHECK(rdma_destroy_id(listen) == 0, "destroy");
}

static void test_migrate(struct rdma_event_channel *ch)
{
	struct rdma_event_channel *ch2 = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct sockaddr_in a = v4("127.0.0.1", 9);
	struct rdma_cm_event *ev;

	CHECK(ch2 && ch2->fd >= 0 && ch2->fd != ch->fd, "second channel");
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create");
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000) == 0, "resolve");
	/* The queued ADDR_RESOLVED moves with the id. */
	CHECK(rdma_migrate_id(id, ch2) == 0 && id->channel == ch2, "migrate");
	ev = expect(ch2, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(ev->id == id, "moved event");
	rdma_ack_cm_event(ev);
	CHECK(rdma_destroy_id(id) == 0, "destroy");
	rdma_destroy_event_channel(ch2);
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	int port[4] = { 7471, 7472, 7473, 7474 };
	char ps[16];

	for (int i = 0; i < 4 && i + 1 < argc; i++)
		port[i] = atoi(argv[i + 1]);

	snprintf(ps, sizeof(ps), "%d", port[0]);
	test_strings();
	test_getaddrinfo(ps);
	test_devices();
	ch = rdma_create_event_channel();
	CHECK(ch && ch->fd >= 0, "channel");
	test_errors(ch);
	test_connection(ch, port[0], 0);
	test_connection(ch, port[1], 1);
	test_connection_ipv6(ch, port[3]);
	test_reject_and_nonblocking(ch, port[2]);
	test_migrate(ch);
	rdma_destroy_event_channel(ch);
	printf("rdmacm_api: %d checks passed\n", checks);
	return 0;
}
