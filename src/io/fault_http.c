/* --fault-api's HTTP side (amqptap/fault_http.h, src/DESIGN.md "Fault injection"). Two threads, as in admin.c: the
 * http thread checks the token, the method and the path, then hands the call to the loop through one slot under mu
 * and waits (the http thread answers one request at a time, so one slot is enough); the loop parses the body (jansson
 * runs on the loop only: route_defs.c swaps its allocator while it parses definitions there), changes the rule set,
 * writes the reply and the log line, and wakes the http thread:
 *
 *   http: token, route --call ASKED, call_fd--> loop: on_call: run (parse, add/remove/list) --DONE, broadcast-->
 *   http: reply          `--no answer in TAP_ADMIN_RENDER_WAIT_MS: withdrawn (IDLE), 503
 *
 * The loop runs a call whole under mu, so a call the http thread withdrew was never begun: a 503 changed nothing. */
#include "amqptap/fault_http.h"

#include "amqptap/admin.h"
#include "amqptap/fault_api.h"
#include "amqptap/log.h"
#include "amqptap/out.h"
#include "amqptap/proxy.h"
#include "amqptap/status.h"
#include "amqptap/thread.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#define PREFIX "/api/faults"
#define TOKEN_MIN 16   /* shorter is guessable */
#define TOKEN_MAX 4096 /* far above any header a client would send; evhttp's header bound is TAP_ADMIN_MAX_HEADERS */
#define SHA_LEN 32

_Static_assert(TAP_FAULT_API_BODY_MAX == TAP_ADMIN_MAX_BODY, "evhttp refuses a body the API would not take");

enum fh_op { FH_LIST, FH_GET, FH_ADD, FH_REMOVE };

/* The slot's life: IDLE --http--> ASKED --loop--> DONE --http--> IDLE, or ASKED --http, too late--> IDLE. */
enum fh_state { FH_IDLE, FH_ASKED, FH_DONE };

struct fh_call {
	enum fh_state state;
	enum fh_op op;
	uint32_t id;                         /* FH_GET, FH_REMOVE */
	char body[TAP_FAULT_API_BODY_MAX];   /* FH_ADD */
	size_t body_len;
	int code;                            /* the reply: HTTP status and JSON body (none for 204) */
	struct tap_buf reply;
};

struct tap_fault_http {
	/* the loop's */
	struct tap_fault_set *set;
	struct event *call_ev; /* call_fd readable */
	/* set at start, read by the http thread */
	bool have_token;
	uint8_t token_sha[SHA_LEN];
	/* shared, under mu */
	pthread_mutex_t mu;
	pthread_cond_t done; /* the loop ran the call */
	struct fh_call call;
	bool quit;
	int call_fd; /* eventfd: http thread -> loop */
};

/* ---- the token ---- */

static bool sha256(const void *p, size_t len, uint8_t out[SHA_LEN])
{
	unsigned int n = 0;
	return EVP_Digest(p, len, out, &n, EVP_sha256(), NULL) == 1 && n == SHA_LEN;
}

/* Reads the token (one line: its end of line is not part of it) from a file nobody but its owner may read or
 * write, and keeps only its SHA-256. 0, or the exit code after one line in err. */
static int read_token(const char *path, uint8_t sha[SHA_LEN], char *err, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		snprintf(err, cap, "--fault-api-token %s: %s", path, strerror(errno));
		return 2;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		snprintf(err, cap, "--fault-api-token %s: not a regular file", path);
		close(fd);
		return 2;
	}
	if (st.st_mode & 077) { /* a secret others could read, or replace */
		snprintf(err, cap, "--fault-api-token %s: mode %04o lets group or others at it: chmod 600 it", path,
		         (unsigned)(st.st_mode & 07777));
		close(fd);
		return 2;
	}
	char buf[TOKEN_MAX + 3];
	size_t n = 0;
	for (ssize_t r; n < sizeof buf && (r = read(fd, buf + n, sizeof buf - n)) != 0;) {
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			snprintf(err, cap, "--fault-api-token %s: %s", path, strerror(errno));
			close(fd);
			OPENSSL_cleanse(buf, sizeof buf);
			return 2;
		}
		n += (size_t)r;
	}
	close(fd);
	if (n && buf[n - 1] == '\n')
		n--;
	if (n && buf[n - 1] == '\r')
		n--;
	bool printable = true;
	for (size_t i = 0; i < n; i++)
		printable = printable && buf[i] > ' ' && buf[i] <= '~';
	int rc = 0;
	if (n < TOKEN_MIN || n > TOKEN_MAX || !printable) {
		snprintf(err, cap, "--fault-api-token %s: expected one line of %d to %d printable characters without "
		         "spaces", path, TOKEN_MIN, TOKEN_MAX);
		rc = 2;
	} else if (!sha256(buf, n, sha)) {
		snprintf(err, cap, "--fault-api-token: no SHA-256 from OpenSSL");
		rc = 1;
	}
	OPENSSL_cleanse(buf, sizeof buf);
	return rc;
}

/* Whether req carries the token: both sides hashed, so the comparison takes the same time whatever was sent. */
static bool authorized(const struct tap_fault_http *f, struct evhttp_request *req)
{
	if (!f->have_token)
		return true;
	const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
	if (!h || strncasecmp(h, "Bearer ", 7) != 0)
		return false;
	const char *tok = h + 7;
	while (*tok == ' ')
		tok++;
	size_t n = strlen(tok);
	while (n && (tok[n - 1] == ' ' || tok[n - 1] == '\t'))
		n--;
	uint8_t sha[SHA_LEN];
	return sha256(tok, n, sha) && CRYPTO_memcmp(sha, f->token_sha, SHA_LEN) == 0;
}

/* ---- replies, on the http thread ---- */

static const char *reason_of(int code)
{
	switch (code) {
	case 200: return "OK";
	case 201: return "Created";
	case 204: return "No Content";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 409: return "Conflict";
	case 415: return "Unsupported Media Type";
	case 500: return "Internal Server Error";
	default: return "Service Unavailable";
	}
}

static void send_json(struct evhttp_request *req, int code, const void *body, size_t len)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);
	evhttp_add_header(h, "Content-Type", "application/json");
	evhttp_add_header(h, "Cache-Control", "no-store");
	evhttp_add_header(h, "X-Content-Type-Options", "nosniff");
	if (len && evbuffer_add(evhttp_request_get_output_buffer(req), body, len) != 0) {
		evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
		return;
	}
	evhttp_send_reply(req, code, reason_of(code), NULL);
}

static void send_refusal(struct evhttp_request *req, int code, const char *why)
{
	struct tap_buf b;
	tap_buf_init(&b);
	tap_fault_api_error_json(&b, why);
	if (b.oom)
		evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
	else
		send_json(req, code, b.data, b.len);
	tap_buf_deinit(&b);
}

/* ---- the calls, on the loop ---- */

static void reply_error(struct fh_call *c, int code, const char *why)
{
	c->code = code;
	tap_buf_reset(&c->reply);
	tap_fault_api_error_json(&c->reply, why);
}

static size_t index_of(const struct tap_fault_set *s, uint32_t id)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->rules[i].id == id)
			return i;
	return SIZE_MAX;
}

static void reply_rule(struct fh_call *c, int code, const struct tap_fault_set *s, size_t i)
{
	c->code = code;
	tap_buf_reset(&c->reply);
	struct tap_json j;
	tap_json_init(&j, &c->reply);
	tap_fault_api_rule_json(&j, s, i);
}

static void run_add(struct tap_fault_http *f, struct fh_call *c, char *line, size_t cap)
{
	struct tap_fault_rule r;
	char err[400];
	if (tap_fault_api_rule(c->body, c->body_len, &r, err, sizeof err)) {
		reply_error(c, 400, err);
		return;
	}
	uint32_t id;
	if (tap_fault_set_add(f->set, &r, tap_now_us(), &id)) {
		snprintf(err, sizeof err, "%d rules in force already: DELETE one first", TAP_FAULT_RULES_MAX);
		reply_error(c, 409, err);
		return;
	}
	reply_rule(c, 201, f->set, f->set->n - 1);
	c->id = id;
	snprintf(line, cap, "WARNING: --fault rule %" PRIu32 " active: %s (added through --fault-api; clients are shown "
	         "failures the broker did not cause; %zu in force)", id, r.text, f->set->n);
}

static void run_remove(struct tap_fault_http *f, struct fh_call *c, char *line, size_t cap)
{
	size_t i = index_of(f->set, c->id);
	if (i == SIZE_MAX) {
		reply_error(c, 404, "no such rule in force");
		return;
	}
	snprintf(line, cap, "--fault rule %" PRIu32 " removed through --fault-api after acting %" PRIu64 " times: %s "
	         "(%zu in force)", c->id, f->set->rule_acted[i], f->set->rules[i].text, f->set->n - 1);
	(void)tap_fault_set_remove(f->set, c->id); /* it is there */
	c->code = 204;
	tap_buf_reset(&c->reply);
}

static void run_list(struct tap_fault_http *f, struct fh_call *c)
{
	c->code = 200;
	tap_buf_reset(&c->reply);
	struct tap_json j;
	tap_json_init(&j, &c->reply);
	tap_json_obj_begin(&j);
	tap_json_kv_uint(&j, "max", TAP_FAULT_RULES_MAX);
	tap_json_key(&j, "rules");
	tap_fault_api_rules_json(&j, f->set);
	tap_json_obj_end(&j);
}

/* Runs the call in the slot (under mu); the log line it makes, if any, goes into line. */
static void run(struct tap_fault_http *f, struct fh_call *c, char *line, size_t cap)
{
	switch (c->op) {
	case FH_LIST:
		run_list(f, c);
		break;
	case FH_GET: {
		size_t i = index_of(f->set, c->id);
		if (i == SIZE_MAX)
			reply_error(c, 404, "no such rule in force");
		else
			reply_rule(c, 200, f->set, i);
		break;
	}
	case FH_ADD:
		run_add(f, c, line, cap);
		break;
	case FH_REMOVE:
		run_remove(f, c, line, cap);
		break;
	}
	if (c->reply.oom) { /* what was done stays done (and logged); only its reply is lost */
		c->code = 500;
		tap_buf_reset(&c->reply);
	}
}

static void on_call(evutil_socket_t fd, short what, void *arg)
{
	struct tap_fault_http *f = arg;
	(void)what;
	uint64_t n;
	(void)!read(fd, &n, sizeof n); /* EAGAIN: a wake already taken */
	char line[TAP_FAULT_SPEC_MAX + 200] = "";
	pthread_mutex_lock(&f->mu);
	if (f->call.state == FH_ASKED) {
		run(f, &f->call, line, sizeof line);
		f->call.state = FH_DONE;
		pthread_cond_broadcast(&f->done);
	}
	pthread_mutex_unlock(&f->mu);
	if (line[0]) /* every change, whatever the log level: the tap lies to its clients from now on, or stops */
		tap_log_error("%s", line);
}

/* ---- answering, on the http thread ---- */

/* Hands the call to the loop and answers what it made of it (503 when it did not come to it in time). */
static void ask_loop(struct tap_fault_http *f, struct evhttp_request *req, enum fh_op op, uint32_t id)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	size_t len = op == FH_ADD ? evbuffer_get_length(in) : 0;
	if (len > TAP_FAULT_API_BODY_MAX) { /* evhttp refuses it first (TAP_ADMIN_MAX_BODY) */
		send_refusal(req, 400, "body too long");
		return;
	}
	struct timespec until = tap_mono_abs(tap_out_clock_us() + (int64_t)TAP_ADMIN_RENDER_WAIT_MS * 1000);
	pthread_mutex_lock(&f->mu);
	struct fh_call *c = &f->call;
	if (f->quit) {
		pthread_mutex_unlock(&f->mu);
		send_refusal(req, 503, "the tap is stopping");
		return;
	}
	c->op = op;
	c->id = id;
	c->body_len = len;
	if (len)
		(void)evbuffer_copyout(in, c->body, len); /* len bytes are there */
	c->state = FH_ASKED;
	uint64_t one = 1;
	(void)!write(f->call_fd, &one, sizeof one); /* an eventfd short of overflow takes it */
	bool late = false;
	while (c->state == FH_ASKED && !f->quit && !late)
		late = pthread_cond_timedwait(&f->done, &f->mu, &until) == ETIMEDOUT;
	if (c->state != FH_DONE) {
		c->state = FH_IDLE; /* withdrawn: the loop, which runs a call under mu, never began it */
		pthread_mutex_unlock(&f->mu);
		send_refusal(req, 503, "the tap's loop did not answer in time: nothing was changed");
		return;
	}
	c->state = FH_IDLE;
	int code = c->code;
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);
	if (code == 201) {
		char where[40];
		snprintf(where, sizeof where, PREFIX "/%" PRIu32, c->id);
		evhttp_add_header(h, "Location", where);
	}
	int added = c->reply.len ? evbuffer_add(evhttp_request_get_output_buffer(req), c->reply.data, c->reply.len) : 0;
	pthread_mutex_unlock(&f->mu);
	if (added != 0)
		evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
	else
		send_json(req, code, NULL, 0);
}

bool tap_fault_http_path(const char *path)
{
	size_t n = strlen(PREFIX);
	return path && strncmp(path, PREFIX, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* The ID of "/api/faults/ID": 1 to UINT32_MAX in decimal, else 0. */
static uint32_t id_of(const char *s)
{
	uint64_t v = 0;
	if (!*s || *s == '0')
		return 0;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return 0;
		v = v * 10 + (uint64_t)(*s - '0');
		if (v > UINT32_MAX)
			return 0;
	}
	return (uint32_t)v;
}

/* Whether the request says its body is JSON. A web page can send a form or text/plain to any address without
 * asking first; for application/json the browser asks (a CORS preflight, OPTIONS, which gets 405 here), so a page
 * the operator visits cannot add a rule. */
static bool json_body(struct evhttp_request *req)
{
	const char *t = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
	size_t n = strlen("application/json");
	return t && strncasecmp(t, "application/json", n) == 0 && (t[n] == '\0' || t[n] == ';' || t[n] == ' ');
}

static void not_allowed(struct evhttp_request *req, const char *allow)
{
	char why[40];
	snprintf(why, sizeof why, "only %s", allow);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", allow);
	send_refusal(req, 405, why);
}

void tap_fault_http_answer(struct tap_fault_http *f, struct evhttp_request *req, const char *path)
{
	if (!authorized(f, req)) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer realm=\"amqptap\"");
		send_refusal(req, 401, "--fault-api-token: send 'Authorization: Bearer TOKEN'");
		return;
	}
	enum evhttp_cmd_type m = evhttp_request_get_command(req);
	const char *rest = path + strlen(PREFIX);
	if (*rest == '\0') {
		if (m == EVHTTP_REQ_GET)
			ask_loop(f, req, FH_LIST, 0);
		else if (m != EVHTTP_REQ_POST)
			not_allowed(req, "GET, POST");
		else if (!json_body(req))
			send_refusal(req, 415, "Content-Type must be application/json");
		else
			ask_loop(f, req, FH_ADD, 0);
		return;
	}
	uint32_t id = id_of(rest + 1);
	if (!id)
		send_refusal(req, 404, "expected /api/faults or /api/faults/ID");
	else if (m == EVHTTP_REQ_GET)
		ask_loop(f, req, FH_GET, id);
	else if (m == EVHTTP_REQ_DELETE)
		ask_loop(f, req, FH_REMOVE, id);
	else
		not_allowed(req, "GET, DELETE");
}

/* ---- life cycle ---- */

struct tap_fault_http *tap_fault_http_new(struct event_base *base, struct tap_fault_set *set, const char *token_path,
                                          char *err, size_t cap, int *code)
{
	struct tap_fault_http *f = calloc(1, sizeof *f);
	if (!f) {
		snprintf(err, cap, "--fault-api: out of memory");
		*code = 1;
		return NULL;
	}
	f->set = set;
	tap_buf_init(&f->call.reply);
	pthread_mutex_init(&f->mu, NULL);
	tap_cond_init_mono(&f->done);
	f->call_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (token_path) {
		f->have_token = true;
		if ((*code = read_token(token_path, f->token_sha, err, cap))) {
			tap_fault_http_free(f);
			return NULL;
		}
	}
	f->call_ev = f->call_fd >= 0 ? event_new(base, f->call_fd, EV_READ | EV_PERSIST, on_call, f) : NULL;
	if (!f->call_ev || event_add(f->call_ev, NULL) < 0) {
		snprintf(err, cap, "--fault-api: %s", f->call_fd < 0 ? strerror(errno) : "out of memory");
		*code = 1;
		tap_fault_http_free(f);
		return NULL;
	}
	return f;
}

void tap_fault_http_quit(struct tap_fault_http *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	f->quit = true;
	pthread_cond_broadcast(&f->done);
	pthread_mutex_unlock(&f->mu);
}

void tap_fault_http_free(struct tap_fault_http *f)
{
	if (!f)
		return;
	if (f->call_ev)
		event_free(f->call_ev);
	if (f->call_fd >= 0)
		close(f->call_fd);
	tap_buf_deinit(&f->call.reply);
	pthread_cond_destroy(&f->done);
	pthread_mutex_destroy(&f->mu);
	OPENSSL_cleanse(f->token_sha, sizeof f->token_sha);
	free(f);
}
