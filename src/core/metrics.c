/* The text of /metrics (Prometheus exposition format 0.0.4), /api/status and /healthz from a snapshot of the
 * counters, and the tally of what only the record stream tells. Every one-number metric is defined once, in
 * METRICS_SCALARS, which feeds both /metrics and the "counters" object of /api/status. */
#include "amqptap/metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

const uint64_t tap_metrics_le_us[TAP_METRICS_N_LE] = {
	100,     150,     200,     300,     500,     700,                                          /* 100 µs */
	1000,    1500,    2000,    3000,    5000,    7000,                                         /* 1 ms */
	10000,   15000,   20000,   30000,   50000,   70000,                                        /* 10 ms */
	100000,  150000,  200000,  300000,  500000,  700000,                                       /* 100 ms */
	1000000, 1500000, 2000000, 3000000, 5000000, 7000000, 10000000,                            /* 1 s */
};

void tap_metrics_hist_add(struct tap_metrics_hist *h, uint64_t lo_us, uint64_t hi_us, uint64_t count)
{
	uint64_t mid = hi_us > lo_us ? lo_us + (hi_us - lo_us) / 2 : lo_us; /* what tap_track_confirm_quantile reports */
	size_t k = 0;
	while (k < TAP_METRICS_N_LE && tap_metrics_le_us[k] < mid)
		k++;
	h->in_le[k] += count;
	h->count += count;
	h->sum_us += count * mid;
}

/* ---- the record stream ---- */

void tap_metrics_tally_init(struct tap_metrics_tally *t)
{
	memset(t, 0, sizeof *t);
	t->codes[t->n_codes++] = 312; /* NO_ROUTE: the return every alert is about */
}

/* The last occurrence of needle in s. A key of a record can be searched for as `"name":"`: inside a JSON string
 * every quote is escaped, so the pattern only ever matches the key itself. */
static const char *find_last(const char *s, size_t len, const char *needle)
{
	size_t n = strlen(needle);
	if (len < n)
		return NULL;
	for (size_t i = len - n + 1; i-- > 0;)
		if (s[i] == needle[0] && s[i + 1] == needle[1] && memcmp(s + i, needle, n) == 0)
			return s + i;
	return NULL;
}

/* memmem's setup costs more than the search on the few dozen bytes searched here. */
static const char *find_first(const char *s, size_t len, const char *needle)
{
	size_t n = strlen(needle);
	for (const char *end = s + len, *p = s; (size_t)(end - p) >= n; p++) {
		p = memchr(p, needle[0], (size_t)(end - p) - n + 1);
		if (!p)
			return NULL;
		if (p[1] == needle[1] && memcmp(p, needle, n) == 0)
			return p;
	}
	return NULL;
}

static bool has_prefix(const char *s, size_t len, const char *prefix)
{
	size_t n = strlen(prefix);
	return len >= n && memcmp(s, prefix, n) == 0;
}

/* The digits after `"reply_code":`, 0 when absent. */
static uint16_t reply_code_of(const char *json, size_t len)
{
	const char *p = find_first(json, len, "\"reply_code\":");
	if (!p)
		return 0;
	p += strlen("\"reply_code\":");
	unsigned code = 0;
	size_t digits = 0;
	while (p < json + len && *p >= '0' && *p <= '9' && digits < 6) {
		code = code * 10 + (unsigned)(*p++ - '0');
		digits++;
	}
	return code <= UINT16_MAX ? (uint16_t)code : 0;
}

static void count_return(struct tap_metrics_tally *t, uint16_t code)
{
	for (size_t i = 0; i < t->n_codes; i++) {
		if (t->codes[i] == code) {
			t->returns_by_code[i]++;
			return;
		}
	}
	if (t->n_codes == TAP_METRICS_MAX_CODES) {
		t->returns_other_code++;
		return;
	}
	t->codes[t->n_codes] = code;
	t->returns_by_code[t->n_codes++] = 1;
}

static bool is(const char *s, size_t len, const char *word)
{
	return len == strlen(word) && memcmp(s, word, len) == 0;
}

static void keep_problem(struct tap_metrics_tally *t, const struct tap_metrics_verdict *v)
{
	struct tap_metrics_problem *p = &t->problems[t->problem_next];
	t->problem_next = (t->problem_next + 1) % TAP_METRICS_PROBLEMS;
	t->problems_seen++;
	if (v->json && v->len <= sizeof p->json) {
		memcpy(p->json, v->json, v->len);
		p->len = (uint16_t)v->len;
		return;
	}
	int n = snprintf(p->json, sizeof p->json,
	                 "{\"type\":\"publish\",\"route\":\"%.*s\",\"confirm\":\"%.*s\",\"truncated\":true,\"bytes\":%zu}",
	                 (int)v->route_len, v->route, (int)v->confirm_len, v->confirm, v->len);
	p->len = n > 0 && (size_t)n < sizeof p->json ? (uint16_t)n : 0;
}

void tap_metrics_tally_verdict(struct tap_metrics_tally *t, const struct tap_metrics_verdict *v)
{
	bool returned = is(v->route, v->route_len, "returned");
	bool unknown = is(v->route, v->route_len, "unknown") || is(v->confirm, v->confirm_len, "unknown");
	bool nacked = is(v->confirm, v->confirm_len, "nack");
	if (returned && v->reply_code)
		count_return(t, v->reply_code);
	if (returned || unknown || nacked)
		keep_problem(t, v);
}

/* The value of a string member found at key (`"name":"` included): up to its closing quote. */
static size_t value_len(const char *v, const char *end)
{
	const char *q = memchr(v, '"', (size_t)(end - v));
	return q ? (size_t)(q - v) : 0;
}

/* Whether [s, *end) ends with word; if so *end moves before it. Inlined with a literal word, a few compares. */
static inline bool take_suffix(const char *s, const char **end, const char *word)
{
	size_t n = strlen(word);
	if ((size_t)(*end - s) < n || memcmp(*end - n, word, n) != 0)
		return false;
	*end -= n;
	return true;
}

/* The tail the tracker writes for a publish that is neither returned, nacked nor unknown, recognised from the end
 * in a few compares (nearly every record, so it must cost next to nothing: about 130 instructions):
 *   "route":"routed"|"unproven","confirm":"ack"|"none"[,"confirm_us":N,"multiple":B],"order":null[,"tx":true]}
 * Anything else, a problem or not, takes the search of tally_publish. */
static bool plainly_settled(const char *json, size_t len)
{
	const char *e = json + len;
	if (!take_suffix(json, &e, "}"))
		return false;
	(void)take_suffix(json, &e, ",\"tx\":true"); /* only on transactional channels */
	if (!take_suffix(json, &e, ",\"order\":null"))
		return false;
	if (take_suffix(json, &e, ",\"multiple\":false") || take_suffix(json, &e, ",\"multiple\":true")) {
		while (e > json && e[-1] >= '0' && e[-1] <= '9')
			e--;
		(void)take_suffix(json, &e, "-"); /* a clock step can make it negative */
		if (!take_suffix(json, &e, ",\"confirm_us\":") || !take_suffix(json, &e, ",\"confirm\":\"ack\""))
			return false;
	} else if (!take_suffix(json, &e, ",\"confirm\":\"none\"")) {
		return false;
	}
	return take_suffix(json, &e, "\"route\":\"routed\"") || take_suffix(json, &e, "\"route\":\"unproven\"");
}

/* The verdict read back from a publish record: the route is searched from the end, where it is near. */
static void tally_publish(struct tap_metrics_tally *t, const char *json, size_t len)
{
	const char *end = json + len;
	const char *r = find_last(json, len, "\"route\":\"");
	if (!r)
		return;
	r += strlen("\"route\":\"");
	const char *c = find_first(r, (size_t)(end - r), "\"confirm\":\"");
	if (!c)
		return;
	c += strlen("\"confirm\":\"");
	struct tap_metrics_verdict v = {.route = r, .route_len = value_len(r, end), .confirm = c,
	                                .confirm_len = value_len(c, end), .json = json, .len = len};
	if (is(v.route, v.route_len, "returned"))
		v.reply_code = reply_code_of(r, (size_t)(end - r));
	tap_metrics_tally_verdict(t, &v);
}

static void tally_connection(struct tap_metrics_tally *t, const char *json, size_t len)
{
	if (find_first(json, len, "\"event\":\"open\""))
		t->upstream = TAP_UPSTREAM_REACHABLE;
	else if (find_first(json, len, "\"event\":\"close\"") && find_first(json, len, "\"by\":\"unreachable\""))
		t->upstream = TAP_UPSTREAM_UNREACHABLE;
}

void tap_metrics_tally_record(struct tap_metrics_tally *t, const char *json, size_t len)
{
	static const char type_key[] = "{\"type\":\"";
	if (plainly_settled(json, len)) /* nearly every record: nothing to count */
		return;
	if (!has_prefix(json, len, type_key))
		return;
	const char *ty = json + strlen(type_key);
	size_t rest = len - strlen(type_key);
	if (has_prefix(ty, rest, "publish\""))
		tally_publish(t, json, len);
	else if (has_prefix(ty, rest, "decode_error\""))
		t->decode_errors++;
	else if (has_prefix(ty, rest, "connection\""))
		tally_connection(t, json, len);
}

/* ---- collecting the tracker's part ---- */

static void add_conn(void *ctx, const struct tap_track_conn_info *c)
{
	struct tap_metrics_snapshot *s = ctx;
	s->channels_open += c->channels;
	if (c->blocked)
		s->connections_blocked++;
}

static void add_bucket(void *ctx, uint64_t lo_us, uint64_t hi_us, uint64_t count)
{
	tap_metrics_hist_add(ctx, lo_us, hi_us, count);
}

void tap_metrics_collect_track(struct tap_metrics_snapshot *s, const struct tap_track *t)
{
	tap_track_get_stats(t, &s->track);
	memset(&s->confirm, 0, sizeof s->confirm);
	tap_track_each_confirm_bucket(t, add_bucket, &s->confirm);
	s->confirm_p50_us = tap_track_confirm_quantile(t, 0.5);
	s->confirm_p90_us = tap_track_confirm_quantile(t, 0.9);
	s->confirm_p99_us = tap_track_confirm_quantile(t, 0.99);
	s->confirm_max_us = tap_track_confirm_quantile(t, 1.0);
	s->channels_open = 0;
	s->connections_blocked = 0;
	tap_track_each_conn(t, add_conn, s);
}

/* ---- one-number metrics, defined once ---- */

enum metric_type { COUNTER, GAUGE, HISTOGRAM };
static const char *const type_names[] = {"counter", "gauge", "histogram"};

/* X(name after "amqptap_", type, help, value from s (snapshot) and t (tally), key in /api/status "counters") */
#define METRICS_SCALARS(X)                                                                                         \
	X("publishes_total", COUNTER, "basic.publish methods seen with their content.", s->track.publishes,       \
	  "publishes")                                                                                             \
	X("publish_records_total", COUNTER, "publish records written: one per publish once the broker answered.", \
	  s->track.publish_records, "publish_records")                                                             \
	X("publishes_outstanding", GAUGE, "Publishes waiting for the broker's answer (held ones included).",     \
	  s->track.outstanding, "outstanding")                                                                     \
	X("publishes_held", GAUGE, "Acked mandatory publishes held for a late Basic.Return.", s->track.held,      \
	  "held")                                                                                                  \
	X("publishes_evicted_total", COUNTER, "Publishes written as unknown (evicted) over --max-outstanding.",  \
	  s->track.evicted, "evicted")                                                                             \
	X("confirms_stray_total", COUNTER, "Acks and nacks for a tag never published or already answered.",      \
	  s->track.stray_confirms, "stray_confirms")                                                               \
	X("returns_unmatched_total", COUNTER, "Basic.Return frames that matched no outstanding publish.",        \
	  s->track.unmatched_returns, "unmatched_returns")                                                         \
	X("decode_errors_total", COUNTER, "Streams whose decoding stopped (decode_error records).",              \
	  t->decode_errors, "decode_errors")                                                                       \
	X("records_written_total", COUNTER, "Records handed to --verdicts (every type).",                       \
	  s->out[TAP_METRICS_OUT_VERDICTS].lines, "records_written")                                               \
	X("connections_open", GAUGE, "Client connections being forwarded.", s->active, "connections_open")        \
	X("connections_total", COUNTER, "Client connections accepted.", s->accepted, "connections_total")         \
	X("connections_blocked", GAUGE, "Connections the broker has blocked (connection.blocked).",              \
	  s->connections_blocked, "connections_blocked")                                                           \
	X("channels_open", GAUGE, "Channels open on the tracked connections.", s->channels_open, "channels_open")  \
	X("upstream_unreachable_total", COUNTER, "Client connections for which the broker could not be reached.", \
	  s->unreachable, "upstream_unreachable")                                                                  \
	X("http_connections_open", GAUGE, "Connections to this metrics endpoint.", s->http_open,                  \
	  "http_connections_open")                                                                                 \
	X("http_connections_total", COUNTER, "Connections accepted by this metrics endpoint.", s->http_total,     \
	  "http_connections_total")                                                                                \
	X("http_timeouts_total", COUNTER, "Metrics endpoint connections closed for sending no complete request in time.", \
	  s->http_timeouts, "http_timeouts")                                                                       \
	X("http_accept_paused_total", COUNTER, "Times the metrics endpoint stopped accepting at its connection cap.", \
	  s->http_paused, "http_accept_paused")

/* ---- Prometheus text ---- */

static void family(struct tap_buf *b, const char *name, enum metric_type type, const char *help)
{
	tap_buf_printf(b, "# HELP amqptap_%s %s\n# TYPE amqptap_%s %s\n", name, help, name, type_names[type]);
}

static void label_value(struct tap_buf *b, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			tap_buf_putc(b, '\\');
		if (*v == '\n') {
			tap_buf_puts(b, "\\n");
			continue;
		}
		tap_buf_putc(b, *v);
	}
}

/* amqptap_NAME{LABEL="VALUE"} N */
static void labelled(struct tap_buf *b, const char *name, const char *label, const char *value, uint64_t n)
{
	tap_buf_printf(b, "amqptap_%s{%s=\"", name, label);
	label_value(b, value);
	tap_buf_printf(b, "\"} %" PRIu64 "\n", n);
}

static void le_label(char out[24], uint64_t us)
{
	snprintf(out, 24, "%.6g", (double)us / 1e6);
}

static void render_hist(struct tap_buf *b, const struct tap_metrics_hist *h)
{
	family(b, "confirm_latency_seconds", HISTOGRAM,
	       "Time from the publish's last frame forwarded to the broker to its Basic.Ack or Basic.Nack.");
	uint64_t cum = 0;
	for (size_t k = 0; k < TAP_METRICS_N_LE; k++) {
		cum += h->in_le[k];
		char le[24];
		le_label(le, tap_metrics_le_us[k]);
		tap_buf_printf(b, "amqptap_confirm_latency_seconds_bucket{le=\"%s\"} %" PRIu64 "\n", le, cum);
	}
	tap_buf_printf(b, "amqptap_confirm_latency_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", h->count);
	tap_buf_printf(b, "amqptap_confirm_latency_seconds_sum %.6f\n", (double)h->sum_us / 1e6);
	tap_buf_printf(b, "amqptap_confirm_latency_seconds_count %" PRIu64 "\n", h->count);
}

static void render_process(struct tap_buf *b, const struct tap_metrics_snapshot *s)
{
	if (!s->have_process)
		return;
	tap_buf_printf(b,
	               "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
	               "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %" PRIu64 "\n"
	               "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
	               "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %" PRIu64 "\n"
	               "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
	               "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.2f\n"
	               "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
	               "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.2f\n"
	               "# HELP process_open_fds Number of open file descriptors.\n"
	               "# TYPE process_open_fds gauge\nprocess_open_fds %" PRIu64 "\n"
	               "# HELP process_max_fds Maximum number of open file descriptors.\n"
	               "# TYPE process_max_fds gauge\nprocess_max_fds %" PRIu64 "\n",
	               s->rss_bytes, s->vsize_bytes, s->cpu_seconds, s->start_time_seconds, s->open_fds, s->max_fds);
}

static const char *const out_names[TAP_METRICS_N_OUT] = {"verdicts", "frames", "pcap"};

void tap_metrics_render_prometheus(const struct tap_metrics_snapshot *s, const struct tap_metrics_tally *t,
                                   struct tap_buf *b)
{
#define METRICS_PROM(name, type, help, value, key)                                                                 \
	family(b, name, type, help);                                                                                \
	tap_buf_printf(b, "amqptap_%s %" PRIu64 "\n", name, (uint64_t)(value));
	METRICS_SCALARS(METRICS_PROM)
#undef METRICS_PROM

	family(b, "publish_routes_total", COUNTER,
	       "Publish records by route: routed (proven), returned, unproven (no proof either way), unknown.");
	labelled(b, "publish_routes_total", "route", "routed", s->track.routed);
	labelled(b, "publish_routes_total", "route", "returned", s->track.returned);
	labelled(b, "publish_routes_total", "route", "unproven", s->track.unproven);
	labelled(b, "publish_routes_total", "route", "unknown", s->track.unknown);
	family(b, "publish_confirms_total", COUNTER,
	       "Publish records by confirm: ack, nack, none (no confirm mode), unknown (ended before the answer).");
	labelled(b, "publish_confirms_total", "confirm", "ack", s->track.acked);
	labelled(b, "publish_confirms_total", "confirm", "nack", s->track.nacked);
	labelled(b, "publish_confirms_total", "confirm", "none", s->track.confirm_none);
	labelled(b, "publish_confirms_total", "confirm", "unknown", s->track.confirm_unknown);

	family(b, "returns_total", COUNTER, "Returned publish records by the Basic.Return reply code.");
	for (size_t i = 0; i < t->n_codes; i++) {
		char code[8];
		snprintf(code, sizeof code, "%u", t->codes[i]);
		labelled(b, "returns_total", "reply_code", code, t->returns_by_code[i]);
	}
	if (t->returns_other_code)
		labelled(b, "returns_total", "reply_code", "other", t->returns_other_code);

	family(b, "warnings_total", COUNTER, "Publisher anti-pattern warnings by rule.");
	for (int r = 0; r < TAP_TRACK_N_RULES; r++) /* every rule, 0 until it fires */
		labelled(b, "warnings_total", "rule", tap_track_rule_name((enum tap_track_rule)r),
		         s->track.warnings_by_rule[r]);

	family(b, "records_lost_total", COUNTER, "Records not written, by reason.");
	labelled(b, "records_lost_total", "reason", "no_memory", s->track.oom);
	family(b, "output_records_lost_total", COUNTER,
	       "Records an output dropped whole (backlog full, write failed, not flushed at exit).");
	for (size_t i = 0; i < TAP_METRICS_N_OUT; i++)
		if (s->out[i].on)
			labelled(b, "output_records_lost_total", "output", out_names[i], s->out[i].lost);
	family(b, "output_write_errors_total", COUNTER, "Failed writes to an output file (the buffered lines are dropped).");
	for (size_t i = 0; i < TAP_METRICS_N_OUT; i++)
		if (s->out[i].on)
			labelled(b, "output_write_errors_total", "output", out_names[i], s->out[i].write_errors);

	family(b, "forwarded_bytes_total", COUNTER, "Bytes forwarded, by direction (c2s: client to broker).");
	labelled(b, "forwarded_bytes_total", "dir", "c2s", s->bytes[TAP_C2S]);
	labelled(b, "forwarded_bytes_total", "dir", "s2c", s->bytes[TAP_S2C]);

	render_hist(b, &s->confirm);

	family(b, "listening", GAUGE, "1 while the AMQP listener accepts clients, 0 while shutting down.");
	tap_buf_printf(b, "amqptap_listening %d\n", s->listening ? 1 : 0);
	if (t->upstream != TAP_UPSTREAM_UNSEEN) {
		family(b, "upstream_up", GAUGE, "1 if the broker answered the last connection attempt, 0 if unreachable.");
		tap_buf_printf(b, "amqptap_upstream_up %d\n", t->upstream == TAP_UPSTREAM_REACHABLE ? 1 : 0);
	}
	family(b, "build_info", GAUGE, "Always 1; the version in a label.");
	labelled(b, "build_info", "version", s->version ? s->version : "", 1);
	render_process(b, s);
}

/* ---- /api/status and /healthz ---- */

/* Microseconds as seconds with three decimals (tap_json_double's 17 digits show binary noise). */
static void json_seconds(struct tap_json *j, const char *key, int64_t us)
{
	char v[32];
	int n = snprintf(v, sizeof v, "%.3f", (double)us / 1e6);
	tap_json_key(j, key);
	tap_json_raw(j, v, n > 0 && (size_t)n < sizeof v ? (size_t)n : 0);
}

static void json_upstream(struct tap_json *j, const struct tap_metrics_tally *t)
{
	tap_json_key(j, "upstream_reachable");
	if (t->upstream == TAP_UPSTREAM_UNSEEN)
		tap_json_null(j);
	else
		tap_json_bool(j, t->upstream == TAP_UPSTREAM_REACHABLE);
}

static void json_head(struct tap_json *j, const struct tap_metrics_snapshot *s, const struct tap_metrics_tally *t)
{
	tap_json_kv_str(j, "status", s->listening ? "ok" : "stopping");
	tap_json_kv_bool(j, "listening", s->listening);
	json_seconds(j, "uptime_seconds", s->now_us - s->start_us);
	tap_json_kv_str(j, "version", s->version ? s->version : "");
	tap_json_kv_str(j, "upstream", s->upstream_name ? s->upstream_name : "");
	json_upstream(j, t);
}

void tap_metrics_render_health(const struct tap_metrics_snapshot *s, const struct tap_metrics_tally *t,
                               struct tap_buf *out)
{
	struct tap_json j;
	tap_json_init(&j, out);
	tap_json_obj_begin(&j);
	json_head(&j, s, t);
	tap_json_kv_uint(&j, "connections_open", s->active);
	tap_json_obj_end(&j);
}

struct rows_ctx {
	struct tap_json *j;
	uint64_t total;
};

static void str_or_null(struct tap_json *j, const char *key, const char *v)
{
	if (v)
		tap_json_kv_str(j, key, v);
	else
		tap_json_kv_null(j, key);
}

static void add_row(void *ctx, const struct tap_track_conn_info *c)
{
	struct rows_ctx *r = ctx;
	if (r->total++ >= TAP_METRICS_MAX_ROWS)
		return;
	struct tap_json *j = r->j;
	tap_json_obj_begin(j);
	tap_json_kv_uint(j, "conn", c->id);
	str_or_null(j, "client", c->client);
	str_or_null(j, "product", c->product);
	str_or_null(j, "user", c->user);
	str_or_null(j, "vhost", c->vhost);
	tap_json_kv_uint(j, "publishes", c->publishes);
	tap_json_kv_uint(j, "routed", c->routed);
	tap_json_kv_uint(j, "returned", c->returned);
	tap_json_kv_uint(j, "unproven", c->unproven);
	tap_json_kv_uint(j, "unknown", c->unknown);
	tap_json_kv_uint(j, "acked", c->acked);
	tap_json_kv_uint(j, "nacked", c->nacked);
	tap_json_kv_uint(j, "outstanding", c->outstanding);
	tap_json_kv_uint(j, "channels", c->channels);
	tap_json_kv_bool(j, "blocked", c->blocked);
	tap_json_kv_ts(j, "since", c->since_us);
	tap_json_obj_end(j);
}

static void json_counts(struct tap_json *j, const char *key, const char *const *names, const uint64_t *values,
                        size_t n)
{
	tap_json_key(j, key);
	tap_json_obj_begin(j);
	for (size_t i = 0; i < n; i++)
		tap_json_kv_uint(j, names[i], values[i]);
	tap_json_obj_end(j);
}

static void json_hist(struct tap_json *j, const struct tap_metrics_snapshot *s)
{
	tap_json_key(j, "confirm_latency");
	tap_json_obj_begin(j);
	tap_json_kv_uint(j, "count", s->confirm.count);
	json_seconds(j, "sum_seconds", (int64_t)s->confirm.sum_us);
	tap_json_kv_uint(j, "p50_us", s->confirm_p50_us);
	tap_json_kv_uint(j, "p90_us", s->confirm_p90_us);
	tap_json_kv_uint(j, "p99_us", s->confirm_p99_us);
	tap_json_kv_uint(j, "max_us", s->confirm_max_us);
	tap_json_key(j, "buckets"); /* not cumulative: le_us null is above every bound */
	tap_json_arr_begin(j);
	for (size_t k = 0; k <= TAP_METRICS_N_LE; k++) {
		tap_json_obj_begin(j);
		if (k < TAP_METRICS_N_LE)
			tap_json_kv_uint(j, "le_us", tap_metrics_le_us[k]);
		else
			tap_json_kv_null(j, "le_us");
		tap_json_kv_uint(j, "count", s->confirm.in_le[k]);
		tap_json_obj_end(j);
	}
	tap_json_arr_end(j);
	tap_json_obj_end(j);
}

void tap_metrics_render_status(const struct tap_metrics_snapshot *s, const struct tap_metrics_tally *t,
                               const struct tap_track *track, struct tap_buf *out)
{
	struct tap_json j;
	tap_json_init(&j, out);
	tap_json_obj_begin(&j);
	json_head(&j, s, t);
	tap_json_kv_ts(&j, "now", s->now_us);

	tap_json_key(&j, "counters");
	tap_json_obj_begin(&j);
#define METRICS_JSON(name, type, help, value, key) tap_json_kv_uint(&j, key, (uint64_t)(value));
	METRICS_SCALARS(METRICS_JSON)
#undef METRICS_JSON
	tap_json_kv_uint(&j, "warnings", s->track.warnings);
	tap_json_kv_uint(&j, "records_lost", s->track.oom);
	tap_json_kv_uint(&j, "bytes_c2s", s->bytes[TAP_C2S]);
	tap_json_kv_uint(&j, "bytes_s2c", s->bytes[TAP_S2C]);
	tap_json_kv_uint(&j, "problems", t->problems_seen);
	tap_json_obj_end(&j);

	static const char *const routes[] = {"routed", "returned", "unproven", "unknown"};
	uint64_t rv[] = {s->track.routed, s->track.returned, s->track.unproven, s->track.unknown};
	json_counts(&j, "routes", routes, rv, 4);
	static const char *const confirms[] = {"ack", "nack", "none", "unknown"};
	uint64_t cv[] = {s->track.acked, s->track.nacked, s->track.confirm_none, s->track.confirm_unknown};
	json_counts(&j, "confirms", confirms, cv, 4);

	tap_json_key(&j, "returns_by_code");
	tap_json_obj_begin(&j);
	for (size_t i = 0; i < t->n_codes; i++) {
		char code[8];
		snprintf(code, sizeof code, "%u", t->codes[i]);
		tap_json_kv_uint(&j, code, t->returns_by_code[i]);
	}
	if (t->returns_other_code)
		tap_json_kv_uint(&j, "other", t->returns_other_code);
	tap_json_obj_end(&j);
	tap_json_key(&j, "warnings_by_rule");
	tap_json_obj_begin(&j);
	for (int r = 0; r < TAP_TRACK_N_RULES; r++)
		tap_json_kv_uint(&j, tap_track_rule_name((enum tap_track_rule)r), s->track.warnings_by_rule[r]);
	tap_json_obj_end(&j);

	json_hist(&j, s);

	tap_json_key(&j, "process");
	tap_json_obj_begin(&j);
	if (s->have_process) {
		tap_json_kv_uint(&j, "rss_bytes", s->rss_bytes);
		json_seconds(&j, "cpu_seconds", (int64_t)(s->cpu_seconds * 1e6));
		tap_json_kv_uint(&j, "open_fds", s->open_fds);
	}
	tap_json_obj_end(&j);

	tap_json_key(&j, "connections");
	tap_json_obj_begin(&j);
	tap_json_key(&j, "rows");
	tap_json_arr_begin(&j);
	struct rows_ctx rows = {.j = &j};
	if (track)
		tap_track_each_conn(track, add_row, &rows);
	tap_json_arr_end(&j);
	tap_json_kv_uint(&j, "total", rows.total);
	tap_json_obj_end(&j);

	tap_json_key(&j, "problems");
	tap_json_obj_begin(&j);
	tap_json_kv_uint(&j, "seen", t->problems_seen);
	tap_json_key(&j, "rows"); /* newest first */
	tap_json_arr_begin(&j);
	size_t kept = t->problems_seen < TAP_METRICS_PROBLEMS ? (size_t)t->problems_seen : TAP_METRICS_PROBLEMS;
	for (size_t i = 0; i < kept; i++) {
		const struct tap_metrics_problem *p =
			&t->problems[(t->problem_next + TAP_METRICS_PROBLEMS - 1 - i) % TAP_METRICS_PROBLEMS];
		if (p->len)
			tap_json_raw(&j, p->json, p->len);
	}
	tap_json_arr_end(&j);
	tap_json_obj_end(&j);
	tap_json_obj_end(&j);
}
