/* The --metrics endpoint on libevent's evhttp (src/DESIGN.md §6c): routes, the snapshot a page renders from, and the
 * bounds. evhttp bounds request sizes and idle time itself; the connection cap (with eviction), the per-request
 * deadline and the rendered pages kept for TAP_ADMIN_CACHE_MS are ours, the first two kept on evhttp 2.1's
 * connection close callback (see adopt_new).
 *
 * Two threads, so that no HTTP client can take the forwarding loop's time: the `http` thread (its own event base,
 * at ADMIN_NICE) accepts, parses and answers every request; the loop only renders a page, when the http thread asks
 * for one that is older than TAP_ADMIN_CACHE_MS, into the copy both share under mu:
 *
 *   http: request --copy fresh--> reply                       loop: want_ev --snapshot, render--> pages[p], gen++
 *             `--stale: wanted |= p, want_fd, wait (rendered)--^            `--broadcast rendered--> http: copy, reply
 *
 * However many ask, the loop renders each page at most once per TAP_ADMIN_CACHE_MS. A loop that does not render
 * within TAP_ADMIN_RENDER_WAIT_MS gets its client a 503. The http thread answers at most TAP_ADMIN_RATE requests a
 * second (pace). */
#include "amqptap/admin.h"
#include "amqptap/fault_http.h"
#include "amqptap/httphost.h"
#include "procself.h"
#include "amqptap/out.h"

#include "amqptap/conn.h"
#include "amqptap/log.h"
#include "amqptap/proxy.h"
#include "amqptap/sniff.h"
#include "amqptap/thread.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* The status page, src/io/status.html embedded at build time (CMakeLists.txt). */
extern const unsigned char tap_admin_status_html[];
extern const size_t tap_admin_status_html_len;

/* One live HTTP connection. evhttp 2.1 tells nothing when it accepts one except by asking for its bufferevent
 * (new_conn), before the connection exists; adopt_new, run from the loop right after the accept, finds the
 * connection as the callback argument evhttp gave that bufferevent and asks to be told when it closes. Until then
 * the bufferevent is referenced, so it can be looked at even if evhttp dropped it at once.
 *
 *   new_conn --adopt_new--> adopted --conn_closed (client gone, timeout, deadline, evhttp_free)--> released
 *                  `--evhttp dropped it already--> released
 */
struct adm_conn {
	struct tap_admin *adm;
	struct bufferevent *bev;         /* referenced until adopted */
	struct evhttp_connection *evcon; /* NULL until adopted */
	struct event *deadline;
	uint64_t stamp; /* when it was accepted or its last request arrived, in the admin's own count: the oldest goes
	                 * first at the cap */
	struct adm_conn *prev, *next;
};

/* Requests waiting for their turn: one per connection at a time (evhttp reads the next once one is answered), with
 * room for the connections freed in a turn beside the live ones. */
#define ADM_WAITING_MAX (2 * TAP_ADMIN_MAX_CONNS)

/* The pages rendered from the counters, each kept and served again for TAP_ADMIN_CACHE_MS. */
enum adm_page { PAGE_METRICS, PAGE_HEALTH, PAGE_STATUS, N_RENDERED, PAGE_INDEX = N_RENDERED, PAGE_NONE };

/* The http thread's nice value (the loop's is the process's): where the two want one CPU, the loop gets about nine
 * tenths of it, so a client that asks as fast as it can slows forwarding by no more than a CPU's small share. */
#define ADMIN_NICE 10

struct adm_rendered {
	struct tap_buf body;
	int code;
	int64_t at_us; /* tap_out_clock_us of the render */
	uint64_t gen;  /* renders of this page so far */
	bool valid;    /* false: never rendered, out of memory, or dropped when shutdown began */
};

struct tap_admin {
	/* the loop's */
	struct event_base *base;
	struct tap_admin_sources src;
	struct tap_metrics_tally *tally;
	struct tap_buf scratch; /* the page being rendered, swapped into pages[] */
	int64_t start_us;
	double start_time_seconds; /* of the process, from /proc; 0: not known */
	bool stopping;
	uint64_t renders;
	struct event *want_ev; /* want_fd readable */

	/* shared, under mu */
	pthread_mutex_t mu;
	pthread_cond_t rendered; /* the loop went through wanted */
	struct adm_rendered pages[N_RENDERED]; /* by enum adm_page */
	unsigned wanted; /* bits by enum adm_page: pages the http thread waits for */
	bool asked;      /* want_fd was written since the loop last took wanted */
	bool quit;       /* tap_admin_free: waits end, the http thread stops */
	int want_fd;     /* eventfd: http thread -> loop */
	int quit_fd;     /* eventfd: tap_admin_free -> http thread */

	/* the http thread's; the loop reads the counters for its snapshot */
	struct event_base *hbase;
	struct evhttp *http;
	struct evhttp_bound_socket *sock;
	pthread_t thread;
	bool started, paused;
	char hostname[256]; /* this machine's name, a Host the endpoint answers to ("": unknown) */
	_Atomic uint64_t open, total, timeouts, pauses, evictions, paced;
	int64_t paid_until_us; /* pay: when the requests taken so far are paid for at TAP_ADMIN_RATE */
	struct evhttp_request *waiting[ADM_WAITING_MAX]; /* requests past the rate, a ring from wait_head */
	size_t wait_head, wait_n;
	struct event *pace_ev; /* the first waiting request is paid for */
	uint64_t closing; /* connections freed in this turn: libevent closes their sockets later in the turn */
	uint64_t stamps;  /* the last adm_conn stamp given */
	struct adm_conn *conns;
	struct event *adopt;  /* activated by new_conn */
	struct event *settle; /* a zero timeout added by conn_release: the next turn, with closing's sockets shut */
	struct event *quit_ev;
};

static void snapshot(const struct tap_admin *a, struct tap_metrics_snapshot *s)
{
	memset(s, 0, sizeof *s);
	s->version = TAP_VERSION;
	s->tap_id = a->src.tap_id;
	s->run = a->src.run;
	s->upstream_name = a->src.upstream_name;
	s->now_us = tap_now_us();
	s->start_us = a->start_us;
	s->listening = !a->stopping;
	if (a->src.topology)
		s->topology = *a->src.topology;
	if (a->src.faults) {
		s->have_faults = true;
		memcpy(s->faults, a->src.faults->acted, sizeof s->faults);
		s->fault_set = a->src.faults; /* rendered on this loop, which alone changes it, before it returns */
		s->fault_api = a->src.fault_http != NULL;
	}
	/* first: reading the capture's counters decodes what libpcap still holds, which the tracker then counts */
	if (a->src.sniff) {
		struct tap_sniff_stats ss;
		tap_sniff_get_stats(a->src.sniff, &ss);
		s->have_capture = true;
		s->capture_packets = ss.packets;
		s->capture_drops = ss.dropped;
		if (a->src.observer) {
			s->capture_gaps = a->src.observer->capture_gaps;
			s->capture_gap_bytes = a->src.observer->gap_bytes;
		}
	}
	if (a->src.track)
		tap_metrics_collect_track(s, a->src.track);
	if (a->src.sniff) { /* nothing is accepted or forwarded: the connections are those the capture follows */
		s->accepted = s->track.connections_total + s->track.conns_unfollowed;
		s->active = s->track.connections_open;
	}
	if (a->src.proxy) {
		struct tap_proxy_stats ps;
		tap_proxy_get_stats(a->src.proxy, &ps);
		s->accepted = ps.accepted;
		s->active = ps.active;
		s->unreachable = ps.unreachable;
		s->address_failures = ps.address_failures;
		s->bytes[TAP_C2S] = ps.bytes_c2s;
		s->bytes[TAP_S2C] = ps.bytes_s2c;
	}
	for (size_t i = 0; i < TAP_METRICS_N_OUT; i++) {
		struct tap_out *o = a->src.outputs[i];
		if (!o)
			continue;
		struct tap_out_stats st;
		tap_out_get_stats(o, &st);
		s->out[i] = (struct tap_metrics_output){
		    .on = true, .lines = st.records, .lost = st.lost, .write_errors = st.write_errors};
		memcpy(s->out[i].lost_by, st.lost_by, sizeof st.lost_by);
	}
	if (a->src.observer)
		s->decode_errors = a->src.observer->decode_errors;
	tap_procself_snapshot(s, a->start_time_seconds);
	s->http_open = a->open;
	s->http_total = a->total;
	s->http_timeouts = a->timeouts;
	s->http_paused = a->pauses;
	s->http_evicted = a->evictions;
	s->http_renders = a->renders;
	s->http_paced = a->paced;
	s->log_lines_lost = tap_log_lost();
}

/* ---- the rate, on the http thread ----
 *
 * Each request costs 1/TAP_ADMIN_RATE s; up to TAP_ADMIN_BURST can be taken at once after a quiet spell (a generic
 * cell rate: paid_until_us runs ahead of the clock by at most the burst). A request past that waits, unanswered, in
 * a queue of arrival order, and is answered when its turn is paid for (pace_ev). evhttp reads a connection's next
 * request only once its last is answered, so a client that pipelines requests as fast as it can has one in the
 * queue at a time and waits behind every other client's: a scrape gets its turn within one request of each other
 * connection (at most TAP_ADMIN_MAX_CONNS / TAP_ADMIN_RATE s), and the rest of a flood waits in its sockets, where
 * it costs nobody CPU. Connections are not paced: they are bounded by the cap, and a client that connects and sends
 * nothing (or closes) costs an accept and a close. */

#define PACE_COST_US (1000000 / TAP_ADMIN_RATE)

/* When the next request is paid for (the clock may be at most BURST - 1 costs behind paid_until_us, or a quiet
 * spell would let BURST + 1 through at once). */
static int64_t paid_at(const struct tap_admin *a)
{
	return a->paid_until_us - (int64_t)(TAP_ADMIN_BURST - 1) * PACE_COST_US;
}

/* Whether a request may be answered at now; its cost is taken when it may. */
static bool pay(struct tap_admin *a, int64_t now)
{
	if (a->paid_until_us < now)
		a->paid_until_us = now;
	if (paid_at(a) > now)
		return false;
	a->paid_until_us += PACE_COST_US;
	return true;
}

static void answer(struct tap_admin *a, struct evhttp_request *req);
static void send_error(struct evhttp_request *req, int code, const char *reason);

/* Answers the waiting requests that are paid for, in the order they came, and sets pace_ev for the next. */
static void serve_waiting(struct tap_admin *a)
{
	while (a->wait_n > 0 && pay(a, tap_out_clock_us())) {
		struct evhttp_request *req = a->waiting[a->wait_head];
		a->wait_head = (a->wait_head + 1) % ADM_WAITING_MAX;
		a->wait_n--;
		answer(a, req);
	}
	if (a->wait_n == 0)
		return;
	int64_t in_us = paid_at(a) - tap_out_clock_us();
	struct timeval tv = {.tv_sec = 0, .tv_usec = in_us > 0 ? (suseconds_t)in_us : 0};
	(void)evtimer_add(a->pace_ev, &tv); /* fails only on a bad timeval */
}

static void on_paid(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	serve_waiting(arg);
}

/* A request that came: answered now if it is paid for and nobody waits before it, else queued (503 when the queue
 * is full, which one request per connection cannot make it). */
static void take_turn(struct tap_admin *a, struct evhttp_request *req)
{
	if (a->wait_n == 0 && pay(a, tap_out_clock_us())) {
		answer(a, req);
		return;
	}
	if (a->wait_n == ADM_WAITING_MAX) {
		send_error(req, HTTP_SERVUNAVAIL, "too many requests waiting");
		return;
	}
	a->paced++;
	a->waiting[(a->wait_head + a->wait_n) % ADM_WAITING_MAX] = req;
	if (a->wait_n++ == 0)
		serve_waiting(a);
}

/* evcon goes: evhttp frees its request (one still attached to it), which must leave the queue first. A request
 * whose client went away while it waited (EOF) stays: evhttp detached it and frees it when it is answered. */
static void drop_waiting(struct tap_admin *a, const struct evhttp_connection *evcon)
{
	size_t kept = 0;
	for (size_t i = 0; i < a->wait_n; i++) {
		struct evhttp_request *req = a->waiting[(a->wait_head + i) % ADM_WAITING_MAX];
		if (evhttp_request_get_connection(req) != evcon)
			a->waiting[(a->wait_head + kept++) % ADM_WAITING_MAX] = req;
	}
	a->wait_n = kept;
}

/* The endpoint stops: every waiting request is answered 503 (which frees a detached one). */
static void refuse_waiting(struct tap_admin *a)
{
	while (a->wait_n > 0) {
		struct evhttp_request *req = a->waiting[a->wait_head];
		a->wait_head = (a->wait_head + 1) % ADM_WAITING_MAX;
		a->wait_n--;
		send_error(req, HTTP_SERVUNAVAIL, "the tap is stopping");
	}
}

/* ---- connections: cap, eviction and deadline ----
 *
 * The cap counts live connections and those freed in this loop turn, whose sockets libevent closes only later in
 * the turn: so the descriptors stay within it however many clients come and go at once. At the cap a new
 * connection takes the place of the one that has waited longest since it was accepted or sent its last request,
 * so idle and slow clients cannot keep a scrape out; at most one a turn, as the freed one counts until the next.
 * When none can go (one went this turn, or all were accepted in it) the listener stops accepting until settle or
 * adopt_new, and further clients wait in the kernel's backlog.
 *
 *   open + closing < cap --accept--> open + closing = cap --accept: the oldest goes, closing 1--> pause
 *        ^                                                                                          |
 *        `---------------------- next turn (settle): closing 0, resume -----------------------------'
 */
static void pause_accepting(struct tap_admin *a)
{
	struct evconnlistener *l = a->sock ? evhttp_bound_socket_get_listener(a->sock) : NULL;
	if (a->paused || !l)
		return;
	(void)evconnlistener_disable(l); /* cannot fail for a listener that is not threadsafe */
	a->paused = true;
	a->pauses++;
}

static void resume_accepting(struct tap_admin *a)
{
	struct evconnlistener *l = a->sock ? evhttp_bound_socket_get_listener(a->sock) : NULL;
	if (!a->paused || !l)
		return;
	if (evconnlistener_enable(l) == 0) /* on failure (no memory) the next close tries again */
		a->paused = false;
}

/* The adopted connection that has waited longest, or NULL. */
static struct adm_conn *oldest_adopted(const struct tap_admin *a)
{
	struct adm_conn *oldest = NULL;
	for (struct adm_conn *c = a->conns; c; c = c->next)
		if (c->evcon && (!oldest || c->stamp < oldest->stamp))
			oldest = c;
	return oldest;
}

static void arm_deadline(struct adm_conn *c)
{
	struct timeval tv = {TAP_ADMIN_REQUEST_SECONDS, 0};
	if (c->deadline)
		(void)evtimer_add(c->deadline, &tv); /* fails only on a bad timeval */
}

static void conn_release(struct adm_conn *c)
{
	struct tap_admin *a = c->adm;
	if (c->deadline)
		event_free(c->deadline);
	if (c->prev)
		c->prev->next = c->next;
	else
		a->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	a->open--;
	a->closing++;
	struct timeval now = {0, 0};
	(void)evtimer_add(a->settle, &now); /* fails only on a bad timeval */
	free(c);
}

/* A loop turn after connections were freed: their sockets are closed. */
static void settle(evutil_socket_t fd, short what, void *arg)
{
	struct tap_admin *a = arg;
	(void)fd;
	(void)what;
	a->closing = 0;
	if (a->open < TAP_ADMIN_MAX_CONNS || oldest_adopted(a))
		resume_accepting(a);
}

/* evhttp frees the connection (client gone, idle timeout, reply sent with Connection: close, bad request, our
 * deadline or evhttp_free). */
static void conn_closed(struct evhttp_connection *evcon, void *arg)
{
	struct adm_conn *c = arg;
	drop_waiting(c->adm, evcon);
	conn_release(c);
}

/* No complete request arrived in time, or the reply was not read. */
static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
	struct adm_conn *c = arg;
	(void)fd;
	(void)what;
	c->adm->timeouts++;
	evhttp_connection_free(c->evcon); /* calls conn_closed, which frees c */
}

static void adopt_new(evutil_socket_t fd, short what, void *arg)
{
	struct tap_admin *a = arg;
	(void)fd;
	(void)what;
	struct adm_conn *next;
	for (struct adm_conn *c = a->conns; c; c = next) {
		next = c->next;
		if (!c->bev)
			continue;
		bufferevent_event_cb evhttp_cb = NULL;
		void *evcon = NULL;
		bufferevent_getcb(c->bev, NULL, NULL, &evhttp_cb, &evcon);
		struct bufferevent *bev = c->bev;
		c->bev = NULL;
		if (evhttp_cb && evcon) {
			c->evcon = evcon;
			evhttp_connection_set_closecb(c->evcon, conn_closed, c);
			arm_deadline(c);
		} else { /* evhttp dropped it already (out of memory) */
			conn_release(c);
		}
		(void)bufferevent_decref(bev); /* returns whether it was the last reference: either is fine */
	}
	if (!a->closing && oldest_adopted(a)) /* at the cap with one to close: the next client takes its place */
		resume_accepting(a);
}

/* evhttp asks for the bufferevent of each accepted connection. NULL lets evhttp make its own, uncounted: only when
 * memory ran out. */
static struct bufferevent *new_conn(struct event_base *base, void *arg)
{
	struct tap_admin *a = arg;
	bool full = a->open + a->closing >= TAP_ADMIN_MAX_CONNS;
	struct adm_conn *old = full && !a->closing ? oldest_adopted(a) : NULL;
	if (old) { /* only the listener's callback is on the stack here, none of old's */
		a->evictions++;
		evhttp_connection_free(old->evcon); /* calls conn_closed, which frees old */
	}
	struct adm_conn *c = calloc(1, sizeof *c);
	struct bufferevent *bev = c ? bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE) : NULL;
	if (!bev) {
		free(c);
		return NULL;
	}
	/* evhttp leaves reading on while a reply waits to be written: without this, a client that pipelines requests
	 * and reads no reply grows the input buffer without end */
	bufferevent_setwatermark(bev, EV_READ, 0, TAP_ADMIN_MAX_INPUT);
	bufferevent_incref(bev);
	c->adm = a;
	c->bev = bev;
	c->deadline = evtimer_new(base, on_deadline, c);
	c->stamp = ++a->stamps;
	c->next = a->conns;
	if (a->conns)
		a->conns->prev = c;
	a->conns = c;
	a->open++;
	a->total++;
	event_active(a->adopt, EV_TIMEOUT, 1);
	if (a->open + a->closing >= TAP_ADMIN_MAX_CONNS && (a->closing || !oldest_adopted(a)))
		pause_accepting(a);
	return bev;
}

/* The request arrived: the reply must be read, and the next request arrive, within a new deadline. */
static void request_arrived(struct tap_admin *a, struct evhttp_request *req)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	for (struct adm_conn *c = a->conns; c && evcon; c = c->next) {
		if (c->evcon == evcon) {
			c->stamp = ++a->stamps;
			arm_deadline(c);
			return;
		}
	}
}

/* ---- routes ---- */

static enum adm_page page_of(const char *path)
{
	if (!path || !*path || strcmp(path, "/") == 0 || strcmp(path, "/index.html") == 0)
		return PAGE_INDEX;
	if (strcmp(path, "/metrics") == 0)
		return PAGE_METRICS;
	if (strcmp(path, "/healthz") == 0)
		return PAGE_HEALTH;
	if (strcmp(path, "/api/status") == 0)
		return PAGE_STATUS;
	return PAGE_NONE;
}

static void headers(struct evhttp_request *req, const char *type)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);
	evhttp_add_header(h, "Content-Type", type);
	evhttp_add_header(h, "Cache-Control", "no-store");
	evhttp_add_header(h, "X-Content-Type-Options", "nosniff");
}

/* Sends the reply whose body is in req's output buffer. libevent sends a HEAD reply's body too, and no
 * Content-Length: the length GET would have is given and the body dropped, or a keep-alive client would read the
 * body as the start of the next response. */
static void send_page(struct evhttp_request *req, int code, const char *reason)
{
	if (evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
		struct evbuffer *out = evhttp_request_get_output_buffer(req);
		char len[24];
		snprintf(len, sizeof len, "%zu", evbuffer_get_length(out));
		evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Length", len);
		evbuffer_drain(out, evbuffer_get_length(out));
	}
	evhttp_send_reply(req, code, reason, NULL);
}

/* An error reply: libevent's own page for GET, a bodiless one for HEAD (see send_page). */
static void send_error(struct evhttp_request *req, int code, const char *reason)
{
	if (evhttp_request_get_command(req) != EVHTTP_REQ_HEAD) {
		evhttp_send_error(req, code, reason);
		return;
	}
	struct evbuffer *out = evhttp_request_get_output_buffer(req);
	evbuffer_drain(out, evbuffer_get_length(out));
	send_page(req, code, reason);
}

static void reply(struct evhttp_request *req, int code, const char *reason, const char *type, const void *body,
                  size_t len)
{
	headers(req, type);
	struct evbuffer *out = evhttp_request_get_output_buffer(req);
	if (evbuffer_add(out, body, len) != 0) {
		send_error(req, HTTP_INTERNAL, "out of memory");
		return;
	}
	send_page(req, code, reason);
}

/* ---- rendering, on the loop ---- */

static bool fresh(const struct adm_rendered *r, int64_t now_us)
{
	return r->valid && now_us - r->at_us < (int64_t)TAP_ADMIN_CACHE_MS * 1000;
}

/* Renders page from a fresh snapshot and hands it to the http thread: the only place the counters are read for a
 * request. */
static void render(struct tap_admin *a, enum adm_page page)
{
	a->renders++;
	struct tap_metrics_snapshot s;
	snapshot(a, &s);
	tap_metrics_tally_rank(a->tally);
	tap_buf_reset(&a->scratch);
	int code = HTTP_OK;
	switch (page) {
	case PAGE_METRICS:
		tap_metrics_render_prometheus(&s, a->tally, &a->scratch);
		break;
	case PAGE_HEALTH:
		tap_metrics_render_health(&s, a->tally, &a->scratch);
		code = s.listening ? HTTP_OK : HTTP_SERVUNAVAIL;
		break;
	case PAGE_STATUS:
		tap_metrics_render_status(&s, a->tally, a->src.track, &a->scratch);
		break;
	case PAGE_INDEX:
	case PAGE_NONE:
		break;
	}
	pthread_mutex_lock(&a->mu);
	struct adm_rendered *r = &a->pages[page];
	struct tap_buf done = a->scratch;
	a->scratch = r->body;
	r->body = done;
	r->code = code;
	r->at_us = tap_out_clock_us();
	r->gen++;
	r->valid = !r->body.oom;
	pthread_mutex_unlock(&a->mu);
}

/* The http thread wants pages: each that is not fresh is rendered. */
static void on_want(evutil_socket_t fd, short what, void *arg)
{
	struct tap_admin *a = arg;
	(void)what;
	uint64_t n;
	(void)!read(fd, &n, sizeof n); /* EAGAIN: a wake already taken */
	pthread_mutex_lock(&a->mu);
	unsigned wanted = a->wanted;
	a->wanted = 0;
	a->asked = false;
	pthread_mutex_unlock(&a->mu);
	for (unsigned p = 0; p < N_RENDERED; p++) {
		if (!(wanted & 1u << p))
			continue;
		pthread_mutex_lock(&a->mu);
		bool now_fresh = fresh(&a->pages[p], tap_out_clock_us());
		pthread_mutex_unlock(&a->mu);
		if (!now_fresh)
			render(a, p);
	}
	pthread_mutex_lock(&a->mu);
	pthread_cond_broadcast(&a->rendered);
	pthread_mutex_unlock(&a->mu);
}

/* ---- answering, on the http thread ---- */

/* Under mu: the loop is to look at page. */
static void ask(struct tap_admin *a, enum adm_page page)
{
	a->wanted |= 1u << page;
	if (a->asked)
		return;
	a->asked = true;
	uint64_t one = 1;
	(void)!write(a->want_fd, &one, sizeof one); /* an eventfd short of overflow takes it */
}

/* Copies page, rendered within TAP_ADMIN_CACHE_MS or since the request came, into req's reply; 0, or the HTTP
 * error to answer instead. */
static int take_page(struct tap_admin *a, enum adm_page page, struct evhttp_request *req, int *code)
{
	struct adm_rendered *r = &a->pages[page];
	struct timespec until = tap_mono_abs(tap_out_clock_us() + (int64_t)TAP_ADMIN_RENDER_WAIT_MS * 1000);
	int err = 0;
	pthread_mutex_lock(&a->mu);
	uint64_t asked_at = r->gen;
	bool ready, late = false;
	while (!(ready = r->valid && (r->gen != asked_at || fresh(r, tap_out_clock_us()))) && !a->quit && !late) {
		if (!(a->wanted & 1u << page))
			ask(a, page);
		late = pthread_cond_timedwait(&a->rendered, &a->mu, &until) == ETIMEDOUT;
	}
	if (!ready) /* out of memory when the loop rendered it; else the loop did not get to it in time, or stops */
		err = r->gen != asked_at && !a->quit ? HTTP_INTERNAL : HTTP_SERVUNAVAIL;
	else if (evbuffer_add(evhttp_request_get_output_buffer(req), r->body.data, r->body.len) != 0)
		err = HTTP_INTERNAL;
	*code = r->code;
	pthread_mutex_unlock(&a->mu);
	return err;
}

static void on_request(struct evhttp_request *req, void *arg)
{
	struct tap_admin *a = arg;
	request_arrived(a, req);
	take_turn(a, req);
}

static void answer(struct tap_admin *a, struct evhttp_request *req)
{
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
	enum adm_page page = page_of(path);
	const char *host = evhttp_find_header(evhttp_request_get_input_headers(req), "Host");
	if (!tap_http_host_allowed(host, a->hostname[0] ? a->hostname : NULL, a->src.hosts)) {
		static const char why[] = "amqptap: this Host is not a name of the endpoint; add it with --metrics-host\n";
		reply(req, 403, "Forbidden", "text/plain; charset=utf-8", why, sizeof why - 1);
		return;
	}
	if (a->src.fault_http && tap_fault_http_path(path)) { /* --fault-api: its methods, token and JSON */
		tap_fault_http_answer(a->src.fault_http, req, path);
		return;
	}
	if (page == PAGE_NONE) {
		send_error(req, HTTP_NOTFOUND, NULL);
		return;
	}
	enum evhttp_cmd_type m = evhttp_request_get_command(req);
	if (m != EVHTTP_REQ_GET && m != EVHTTP_REQ_HEAD) {
		static const char why[] = "only GET and HEAD\n";
		evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
		reply(req, 405, "Method Not Allowed", "text/plain; charset=utf-8", why, sizeof why - 1);
		return;
	}
	if (page == PAGE_INDEX) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Security-Policy",
		                  "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
		                  "connect-src 'self'; img-src data:");
		reply(req, HTTP_OK, "OK", "text/html; charset=utf-8", tap_admin_status_html, tap_admin_status_html_len);
		return;
	}
	int code;
	int err = take_page(a, page, req, &code);
	if (err) {
		send_error(req, err, err == HTTP_INTERNAL ? "out of memory" : "the tap did not render the page in time");
		return;
	}
	const char *type = page == PAGE_METRICS ? "text/plain; version=0.0.4; charset=utf-8" : "application/json";
	headers(req, type);
	send_page(req, code, code == HTTP_OK ? "OK" : "Service Unavailable");
}

/* The http thread's loop, until tap_admin_free. */
static void on_quit(evutil_socket_t fd, short what, void *arg)
{
	struct tap_admin *a = arg;
	(void)fd;
	(void)what;
	refuse_waiting(a);
	event_base_loopbreak(a->hbase);
}

static void *http_main(void *arg)
{
	struct tap_admin *a = arg;
	(void)setpriority(PRIO_PROCESS, (id_t)gettid(), ADMIN_NICE); /* failing that, it runs as the loop does */
	(void)event_base_dispatch(a->hbase);
	return NULL;
}

/* ---- life cycle ---- */

static void format_bound(struct evhttp_bound_socket *sock, char *out, size_t cap)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	char host[64] = "?";
	unsigned port = 0;
	if (getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &len) == 0) {
		if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
			(void)evutil_inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof host); /* "?" stays on failure */
			port = ntohs(s6->sin6_port);
			snprintf(out, cap, "[%s]:%u", host, port);
			return;
		}
		struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
		(void)evutil_inet_ntop(AF_INET, &s4->sin_addr, host, sizeof host); /* "?" stays on failure */
		port = ntohs(s4->sin_port);
	}
	snprintf(out, cap, "%s:%u", host, port);
}

/* Whether the endpoint listens on a loopback address only. */
static bool listens_on_loopback(const struct tap_admin *a)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	if (getsockname(evhttp_bound_socket_get_fd(a->sock), (struct sockaddr *)&ss, &len) != 0)
		return false;
	if (ss.ss_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
	if (ss.ss_family != AF_INET6)
		return false;
	const struct in6_addr *a6 = &((const struct sockaddr_in6 *)&ss)->sin6_addr;
	return IN6_IS_ADDR_LOOPBACK(a6) || (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
}

struct tap_admin *tap_admin_new(struct event_base *base, const struct tap_conf_addr *addr,
                                const struct tap_admin_sources *src, char *bound, size_t bound_cap, char *err,
                                size_t err_cap)
{
	struct tap_admin *a = calloc(1, sizeof *a);
	if (!a) {
		snprintf(err, err_cap, "out of memory");
		return NULL;
	}
	a->base = base;
	a->src = *src;
	a->start_us = tap_now_us();
	a->start_time_seconds = tap_procself_start_time();
	if (gethostname(a->hostname, sizeof a->hostname - 1) != 0)
		a->hostname[0] = '\0';
	tap_buf_init(&a->scratch);
	for (size_t i = 0; i < N_RENDERED; i++)
		tap_buf_init(&a->pages[i].body);
	pthread_mutex_init(&a->mu, NULL);
	tap_cond_init_mono(&a->rendered);
	a->want_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	a->quit_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	a->tally = malloc(sizeof *a->tally);
	a->hbase = event_base_new();
	a->http = a->hbase ? evhttp_new(a->hbase) : NULL;
	a->adopt = a->hbase ? event_new(a->hbase, -1, 0, adopt_new, a) : NULL;
	a->settle = a->hbase ? evtimer_new(a->hbase, settle, a) : NULL;
	a->pace_ev = a->hbase ? evtimer_new(a->hbase, on_paid, a) : NULL;
	a->quit_ev = a->hbase && a->quit_fd >= 0 ? event_new(a->hbase, a->quit_fd, EV_READ, on_quit, a) : NULL;
	a->want_ev = a->want_fd >= 0 ? event_new(base, a->want_fd, EV_READ | EV_PERSIST, on_want, a) : NULL;
	if (!a->tally || !a->http || !a->adopt || !a->settle || !a->pace_ev || !a->quit_ev || !a->want_ev ||
	    event_add(a->quit_ev, NULL) < 0 || event_add(a->want_ev, NULL) < 0) {
		snprintf(err, err_cap, "%s", a->want_fd < 0 || a->quit_fd < 0 ? strerror(errno) : "out of memory");
		tap_admin_free(a);
		return NULL;
	}
	tap_metrics_tally_init(a->tally);
	evhttp_set_max_headers_size(a->http, TAP_ADMIN_MAX_HEADERS);
	evhttp_set_max_body_size(a->http, TAP_ADMIN_MAX_BODY);
	evhttp_set_timeout(a->http, TAP_ADMIN_IDLE_SECONDS);
	/* every method reaches on_request, which answers 405 (evhttp itself would answer 501) */
	evhttp_set_allowed_methods(a->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT |
	                                        EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
	                                        EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
	evhttp_set_bevcb(a->http, new_conn, a);
	evhttp_set_gencb(a->http, on_request, a);
	a->sock = evhttp_bind_socket_with_handle(a->http, addr->host, addr->port);
	if (!a->sock) {
		char shown[300];
		tap_conf_addr_format(addr, shown, sizeof shown);
		snprintf(err, err_cap, "--metrics %s: %s", shown, strerror(errno));
		tap_admin_free(a);
		return NULL;
	}
	format_bound(a->sock, bound, bound_cap);
	if (!listens_on_loopback(a)) /* one line, whatever the log level */
		tap_log_error("WARNING: --metrics %s is not on loopback and asks for no password: whoever reaches it reads "
		              "the counters and exchange names, and on /api/status client addresses, users, vhosts and the "
		              "last problem publishes with their routing keys and message ids",
		              bound);
	int rc = tap_thread_start(&a->thread, http_main, a, "http");
	if (rc != 0) {
		snprintf(err, err_cap, "--metrics: no thread: %s", strerror(rc));
		tap_admin_free(a);
		return NULL;
	}
	a->started = true;
	return a;
}

struct tap_metrics_tally *tap_admin_tally(struct tap_admin *a)
{
	return a->tally;
}

void tap_admin_stopping(struct tap_admin *a)
{
	if (!a)
		return;
	a->stopping = true;
	pthread_mutex_lock(&a->mu);
	for (size_t i = 0; i < N_RENDERED; i++) /* /healthz says 503 at once */
		a->pages[i].valid = false;
	pthread_mutex_unlock(&a->mu);
}

void tap_admin_free(struct tap_admin *a)
{
	if (!a)
		return;
	if (a->started) {
		pthread_mutex_lock(&a->mu);
		a->quit = true;
		pthread_cond_broadcast(&a->rendered);
		pthread_mutex_unlock(&a->mu);
		tap_fault_http_quit(a->src.fault_http); /* a request waiting for the loop ends too */
		uint64_t one = 1;
		(void)!write(a->quit_fd, &one, sizeof one); /* a fresh eventfd takes it */
		pthread_join(a->thread, NULL);
	}
	/* the http thread is gone: its objects are freed here */
	a->sock = NULL; /* evhttp_free frees it before it closes the connections */
	if (a->http)
		evhttp_free(a->http); /* closes every adopted connection: conn_closed */
	while (a->conns) {    /* accepted in the last turn, not adopted yet */
		struct bufferevent *bev = a->conns->bev;
		conn_release(a->conns);
		if (bev)
			(void)bufferevent_decref(bev); /* evhttp let it go: this frees it */
	}
	if (a->adopt)
		event_free(a->adopt);
	if (a->settle)
		event_free(a->settle);
	if (a->pace_ev)
		event_free(a->pace_ev);
	if (a->quit_ev)
		event_free(a->quit_ev);
	if (a->hbase)
		event_base_free(a->hbase);
	if (a->want_ev)
		event_free(a->want_ev);
	if (a->want_fd >= 0)
		close(a->want_fd);
	if (a->quit_fd >= 0)
		close(a->quit_fd);
	for (size_t i = 0; i < N_RENDERED; i++)
		tap_buf_deinit(&a->pages[i].body);
	tap_buf_deinit(&a->scratch);
	pthread_cond_destroy(&a->rendered);
	pthread_mutex_destroy(&a->mu);
	free(a->tally);
	free(a);
}
