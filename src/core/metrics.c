/* The text of /metrics (Prometheus exposition format 0.0.4), /api/status and /healthz from a snapshot of the
 * counters, and the tally the tracker's verdict and connection hooks feed. Every one-number metric is defined once, in
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

void tap_metrics_hist_fold(struct tap_metrics_hist *h, const struct tap_hist *from)
{
	uint64_t lo = 0;
	for (unsigned i = 0; i < TAP_HIST_BUCKETS; i++) {
		uint64_t top = tap_hist_bucket_max(i);
		uint64_t hi = i == TAP_HIST_BUCKETS - 1 ? from->max + 1 : top + 1; /* the last takes every larger value */
		if (from->bucket[i])
			tap_metrics_hist_add(h, lo, hi, from->bucket[i]);
		lo = top + 1;
	}
}

/* ---- the tracker's hooks ---- */

void tap_metrics_tally_init(struct tap_metrics_tally *t)
{
	memset(t, 0, sizeof *t);
	t->codes[t->n_codes++] = 312; /* NO_ROUTE: the return every alert is about */
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

static const char *const route_names[TAP_METRICS_N_ROUTES] = {"routed", "returned", "unproven", "unknown"};
static const char *const confirm_names[] = {"ack", "nack", "none", "unknown"};

/* The end of the JSON value at json[i] (written by the tap: no white space), or len if it runs off. */
static size_t json_skip(const char *json, size_t len, size_t i)
{
	size_t depth = 0;
	bool in_string = false;
	for (; i < len; i++) {
		char c = json[i];
		if (in_string) {
			if (c == '\\') {
				i++;
			} else if (c == '"') {
				in_string = false;
				if (depth == 0)
					return i + 1;
			}
		} else if (c == '"') {
			in_string = true;
		} else if (c == '{' || c == '[') {
			depth++;
		} else if (c == '}' || c == ']') {
			if (depth <= 1)
				return depth ? i + 1 : i;
			depth--;
		} else if (c == ',' && depth == 0) {
			return i;
		}
	}
	return len;
}

/* Takes the member key (with its comma) out of the JSON object in json; *len shrinks. */
static void drop_member(char *json, size_t *len, const char *key)
{
	size_t klen = strlen(key);
	size_t i = 1; /* past the '{' */
	while (i < *len && json[i] == '"') {
		size_t key_end = json_skip(json, *len, i);
		size_t end = key_end < *len ? json_skip(json, *len, key_end + 1) : *len; /* past the ':' */
		if (key_end - i == klen + 2 && memcmp(json + i + 1, key, klen) == 0) {
			size_t from = json[i - 1] == ',' ? i - 1 : i;
			if (from == i && end < *len && json[end] == ',')
				end++; /* the first member: its comma goes with it */
			memmove(json + from, json + end, *len - end);
			*len -= end - from;
			return;
		}
		i = end < *len && json[end] == ',' ? end + 1 : *len;
	}
}

static void keep_problem(struct tap_metrics_tally *t, const struct tap_track_verdict *v)
{
	struct tap_metrics_problem *p = &t->problems[t->problem_next];
	t->problem_next = (t->problem_next + 1) % TAP_METRICS_PROBLEMS;
	t->problems_seen++;
	if (v->record.ptr && v->record.len <= sizeof p->json) {
		size_t len = v->record.len;
		memcpy(p->json, v->record.ptr, len);
		if (memmem(p->json, len, "\"header_values", 14)) { /* what --header-values asked for, for the files only */
			drop_member(p->json, &len, "header_values");
			drop_member(p->json, &len, "header_values_truncated");
		}
		p->len = (uint16_t)len;
		return;
	}
	int n = snprintf(p->json, sizeof p->json,
	                 "{\"type\":\"publish\",\"conn\":%" PRIu64 ",\"channel\":%u,\"route\":\"%s\",\"confirm\":\"%s\","
	                 "\"truncated\":true,\"bytes\":%zu}",
	                 v->conn, v->channel, route_names[v->route], confirm_names[v->confirm], v->record.len);
	p->len = n > 0 && (size_t)n < sizeof p->json ? (uint16_t)n : 0;
}

static bool same_exchange(const struct tap_metrics_exchange *e, struct tap_slice x)
{
	return e->len == x.len && memcmp(e->name, x.ptr, x.len) == 0;
}

/* The candidate slot of exchange x: found, new, or (Space-Saving) the least counted one without a series, which
 * x inherits with its count. */
static struct tap_metrics_exchange *exchange_slot(struct tap_metrics_tally *t, struct tap_slice x)
{
	if (t->n_exchanges && same_exchange(&t->exchanges[t->last_exchange], x))
		return &t->exchanges[t->last_exchange];
	size_t at = t->n_exchanges;
	for (size_t i = 0; i < t->n_exchanges; i++) {
		if (same_exchange(&t->exchanges[i], x)) {
			t->last_exchange = i;
			return &t->exchanges[i];
		}
	}
	uint64_t inherited = 0;
	if (at == TAP_METRICS_EXCHANGE_CANDIDATES) {
		for (size_t i = 0; i < TAP_METRICS_EXCHANGE_CANDIDATES; i++)
			if (!t->exchanges[i].labelled && (at == TAP_METRICS_EXCHANGE_CANDIDATES ||
			                                  t->exchanges[i].seen < t->exchanges[at].seen))
				at = i;
		inherited = t->exchanges[at].seen;
	} else {
		t->n_exchanges++;
	}
	struct tap_metrics_exchange *e = &t->exchanges[at];
	memset(e, 0, sizeof *e);
	e->len = (uint8_t)(x.len < sizeof e->name ? x.len : sizeof e->name);
	memcpy(e->name, x.ptr, e->len);
	e->seen = inherited;
	e->inherited = inherited;
	if (t->n_labelled < TAP_METRICS_EXCHANGES) { /* a free series: counted exactly from its first publish */
		e->labelled = true;
		t->n_labelled++;
	}
	t->last_exchange = at;
	return e;
}

static void count_exchange(struct tap_metrics_tally *t, const struct tap_track_verdict *v)
{
	struct tap_slice x = v->exchange;
	if (!x.ptr)
		x = (struct tap_slice){(const uint8_t *)"", 0};
	struct tap_metrics_exchange *e = exchange_slot(t, x);
	e->seen++;
	if (e->labelled)
		e->by_route[v->route]++;
	else
		t->other_by_route[v->route]++;
}

void tap_metrics_tally_verdict(void *tally, const struct tap_track_verdict *v)
{
	struct tap_metrics_tally *t = tally;
	count_exchange(t, v);
	if (v->route == TAP_TRACK_ROUTE_ROUTED || v->route == TAP_TRACK_ROUTE_UNPROVEN) {
		if (v->confirm == TAP_TRACK_CONFIRM_ACK || v->confirm == TAP_TRACK_CONFIRM_NONE)
			return; /* nearly every publish */
	}
	if (v->route == TAP_TRACK_ROUTE_RETURNED) {
		if (v->reply_code)
			count_return(t, v->reply_code);
		if (v->return_us >= 0)
			tap_hist_add(&t->return_us, v->return_us);
	}
	keep_problem(t, v);
}

const char *const tap_metrics_close_by_names[TAP_METRICS_N_CLOSE_BY] = {
#define TAP_METRICS_CLOSE_BY_NAME(name) #name,
	TAP_METRICS_CLOSE_BY(TAP_METRICS_CLOSE_BY_NAME)
#undef TAP_METRICS_CLOSE_BY_NAME
};

static enum tap_metrics_close_by close_by(const char *by)
{
	for (int i = 0; by && i < TAP_CLOSE_BY_other; i++)
		if (strcmp(by, tap_metrics_close_by_names[i]) == 0)
			return (enum tap_metrics_close_by)i;
	return TAP_CLOSE_BY_other;
}

void tap_metrics_tally_conn(void *tally, const struct tap_track_conn_event *e)
{
	struct tap_metrics_tally *t = tally;
	if (e->change == TAP_TRACK_CONN_OPENED) {
		t->upstream = TAP_UPSTREAM_REACHABLE;
	} else if (e->change == TAP_TRACK_CONN_ENDED) {
		enum tap_metrics_close_by by = close_by(e->reason_by);
		t->closed_by[by]++;
		if (by == TAP_CLOSE_BY_unreachable || (by == TAP_CLOSE_BY_broker_tls_error && !e->opened)) {
			t->upstream = TAP_UPSTREAM_UNREACHABLE;
			t->upstream_failure = by;
		}
	}
}

static uint64_t certain(const struct tap_metrics_exchange *e)
{
	return e->seen - e->inherited;
}

/* The candidate without a series that has the highest certain count, or the one with a series with the lowest. */
static struct tap_metrics_exchange *extreme(struct tap_metrics_tally *t, bool labelled)
{
	struct tap_metrics_exchange *best = NULL;
	for (size_t i = 0; i < t->n_exchanges; i++) {
		struct tap_metrics_exchange *e = &t->exchanges[i];
		if (e->labelled != labelled)
			continue;
		if (!best || (labelled ? certain(e) < certain(best) : certain(e) > certain(best)))
			best = e;
	}
	return best;
}

void tap_metrics_tally_rank(struct tap_metrics_tally *t)
{
	for (size_t swaps = 0; swaps < TAP_METRICS_EXCHANGES; swaps++) {
		struct tap_metrics_exchange *in = extreme(t, false);
		struct tap_metrics_exchange *out = extreme(t, true);
		if (!in || (out && certain(in) <= certain(out) + certain(out) / 8))
			return;
		if (out) { /* its series ends; its publishes count in "(other)" from now on */
			out->labelled = false;
			memset(out->by_route, 0, sizeof out->by_route);
		} else {
			t->n_labelled++;
		}
		in->labelled = true;
	}
}

/* ---- collecting the tracker's part ---- */

static void add_conn(void *ctx, const struct tap_track_conn_info *c)
{
	struct tap_metrics_snapshot *s = ctx;
	s->channels_open += c->channels;
	if (c->blocked)
		s->connections_blocked++;
}

void tap_metrics_collect_track(struct tap_metrics_snapshot *s, const struct tap_track *t)
{
	tap_track_get_stats(t, &s->track);
	memset(&s->confirm, 0, sizeof s->confirm);
	tap_metrics_hist_fold(&s->confirm, tap_track_confirm_hist(t));
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
#define TAP_METRICS_XSTR(x) #x
#define TAP_METRICS_STR(x) TAP_METRICS_XSTR(x)
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
	X("publishes_evicted_total", COUNTER,                                                                     \
	  "Publishes written as unknown (evicted) over --max-outstanding or --max-tracking-memory.",              \
	  s->track.evicted, "evicted")                                                                             \
	X("confirms_stray_total", COUNTER, "Acks and nacks for a tag never published or already answered.",      \
	  s->track.stray_confirms, "stray_confirms")                                                               \
	X("returns_unmatched_total", COUNTER, "Basic.Return frames that matched no outstanding publish.",        \
	  s->track.unmatched_returns, "unmatched_returns")                                                         \
	X("tracking_short_of_memory_total", COUNTER,                                                              \
	  "Times tracking found no memory: a record lost, a verdict written early, details left out.",            \
	  s->track.oom, "tracking_short_of_memory")                                                                \
	X("connections_unfollowed_total", COUNTER,                                                                \
	  "Connections with no records: no memory to follow them, or to take them.", s->track.conns_unfollowed,   \
	  "connections_unfollowed")                                                                                \
	X("decode_errors_total", COUNTER, "Streams whose decoding stopped (decode_error records).",              \
	  s->decode_errors, "decode_errors")                                                                       \
	X("records_written_total", COUNTER, "Records handed to --verdicts (every type).",                       \
	  s->out[TAP_METRICS_OUT_VERDICTS].lines, "records_written")                                               \
	X("log_lines_lost_total", COUNTER,                                                                         \
	  "Lines of the tap's own log that stderr did not take (nobody read it, or it failed); the exit code is 1.", \
	  s->log_lines_lost, "log_lines_lost")                                                                      \
	X("connections_open", GAUGE, "Client connections open (forwarded; in sniff, followed).", s->active,      \
	  "connections_open")                                                                                      \
	X("connections_total", COUNTER, "Client connections accepted (in sniff, seen).", s->accepted,             \
	  "connections_total")                                                                                     \
	X("connections_blocked", GAUGE, "Connections the broker has blocked (connection.blocked).",              \
	  s->connections_blocked, "connections_blocked")                                                           \
	X("channels_open", GAUGE, "Channels open on the tracked connections.", s->channels_open, "channels_open")  \
	X("upstream_unreachable_total", COUNTER, "Client connections for which the broker could not be reached.", \
	  s->unreachable, "upstream_unreachable")                                                                  \
	X("upstream_address_failures_total", COUNTER,                                                              \
	  "Connects to one address of the broker's name that failed (the connection may have gone on to the next).", \
	  s->address_failures, "upstream_address_failures")                                                        \
	X("http_connections_open", GAUGE, "Connections to this metrics endpoint.", s->http_open,                  \
	  "http_connections_open")                                                                                 \
	X("http_connections_total", COUNTER, "Connections accepted by this metrics endpoint.", s->http_total,     \
	  "http_connections_total")                                                                                \
	X("http_timeouts_total", COUNTER, "Metrics endpoint connections closed for sending no complete request in time.", \
	  s->http_timeouts, "http_timeouts")                                                                       \
	X("http_accept_paused_total", COUNTER,                                                                   \
	  "Times the metrics endpoint stopped accepting at its connection cap (until the next loop turn at most).", \
	  s->http_paused, "http_accept_paused")                                                                    \
	X("http_evicted_total", COUNTER,                                                                          \
	  "Metrics endpoint connections closed at the cap to make room: the longest without a request first.",    \
	  s->http_evicted, "http_evicted")                                                                         \
	X("http_renders_total", COUNTER,                                                                          \
	  "Pages the metrics endpoint rendered; a request within a second of its page's last render gets that copy.", \
	  s->http_renders, "http_renders")                                                                         \
	X("http_paced_total", COUNTER,                                                                            \
	  "Requests the metrics endpoint made wait to stay within its rate (all clients together).",                \
	  s->http_paced, "http_paced")

/* ---- Prometheus text ---- */

static void family(struct tap_buf *b, const char *name, enum metric_type type, const char *help)
{
	tap_buf_printf(b, "# HELP amqptap_%s %s\n# TYPE amqptap_%s %s\n", name, help, name, type_names[type]);
}

/* A label value as the text format wants it: UTF-8 with \\, \" and \n escaped; a byte that is not valid UTF-8
 * (an exchange name is any shortstr) becomes U+FFFD. */
static void label_valuen(struct tap_buf *b, const char *v, size_t len)
{
	const unsigned char *u = (const unsigned char *)v;
	for (size_t i = 0; i < len;) {
		size_t n = tap_json_utf8_len(u + i, len - i);
		if (n == 0) {
			tap_buf_puts(b, "\xEF\xBF\xBD");
			i++;
			continue;
		}
		if (u[i] == '\\' || u[i] == '"')
			tap_buf_putc(b, '\\');
		if (u[i] == '\n')
			tap_buf_puts(b, "\\n");
		else
			tap_buf_append(b, v + i, n);
		i += n;
	}
}

static void label_value(struct tap_buf *b, const char *v)
{
	label_valuen(b, v, strlen(v));
}

/* amqptap_NAME{LABEL="VALUE",...} N, kv holding the labels and their values in turn */
static void labelled_n(struct tap_buf *b, const char *name, const char *const *kv, size_t labels, uint64_t n)
{
	tap_buf_printf(b, "amqptap_%s{", name);
	for (size_t i = 0; i < labels; i++) {
		tap_buf_printf(b, "%s%s=\"", i ? "," : "", kv[2 * i]);
		label_value(b, kv[2 * i + 1]);
		tap_buf_putc(b, '"');
	}
	tap_buf_printf(b, "} %" PRIu64 "\n", n);
}

static void labelled(struct tap_buf *b, const char *name, const char *label, const char *value, uint64_t n)
{
	labelled_n(b, name, (const char *const[]){label, value}, 1, n);
}

static void labelled2(struct tap_buf *b, const char *name, const char *label, const char *value, const char *label2,
		      const char *value2, uint64_t n)
{
	labelled_n(b, name, (const char *const[]){label, value, label2, value2}, 2, n);
}

static void le_label(char out[24], uint64_t us)
{
	snprintf(out, 24, "%.6g", (double)us / 1e6);
}

static void render_hist(struct tap_buf *b, const char *name, const char *help, const struct tap_metrics_hist *h)
{
	family(b, name, HISTOGRAM, help);
	uint64_t cum = 0;
	for (size_t k = 0; k < TAP_METRICS_N_LE; k++) {
		cum += h->in_le[k];
		char le[24];
		le_label(le, tap_metrics_le_us[k]);
		tap_buf_printf(b, "amqptap_%s_bucket{le=\"%s\"} %" PRIu64 "\n", name, le, cum);
	}
	tap_buf_printf(b, "amqptap_%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, h->count);
	tap_buf_printf(b, "amqptap_%s_sum %.6f\n", name, (double)h->sum_us / 1e6);
	tap_buf_printf(b, "amqptap_%s_count %" PRIu64 "\n", name, h->count);
}

/* The label values of the pseudo exchanges (an empty label value would mean no label at all to Prometheus).
 * RabbitMQ takes any shortstr as an exchange name, these too: exchange_label keeps real names off them. */
#define EXCHANGE_DEFAULT "(AMQP default)"
#define EXCHANGE_OTHER "(other)"

/* The label value of a real exchange, before the text format's escaping: the name, with a byte that is not UTF-8
 * as \xHH, a backslash as \\ and a backslash before a leading "(". Each name has its own value (two names that
 * differ only in bytes that are not UTF-8 would both show U+FFFD, and of a series that comes twice in a scrape
 * Prometheus keeps one sample and drops the other), and none starts with "(" as the pseudo names do. Returns its
 * length; out holds 4 bytes per name byte. */
static size_t exchange_label(char *out, const char *name, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *u = (const unsigned char *)name;
	size_t n = 0;
	if (len && name[0] == '(')
		out[n++] = '\\';
	for (size_t i = 0; i < len;) {
		size_t k = tap_json_utf8_len(u + i, len - i);
		if (k == 0) {
			out[n++] = '\\';
			out[n++] = 'x';
			out[n++] = hex[u[i] >> 4];
			out[n++] = hex[u[i] & 15];
			i++;
			continue;
		}
		if (u[i] == '\\')
			out[n++] = '\\';
		memcpy(out + n, u + i, k);
		n += k;
		i += k;
	}
	return n;
}

static void exchange_routes(struct tap_buf *b, const char *label, size_t len, const uint64_t *by_route)
{
	for (size_t r = 0; r < TAP_METRICS_N_ROUTES; r++) {
		tap_buf_puts(b, "amqptap_exchange_publishes_total{exchange=\"");
		label_valuen(b, label, len);
		tap_buf_printf(b, "\",route=\"%s\"} %" PRIu64 "\n", route_names[r], by_route[r]);
	}
}

static void render_exchanges(struct tap_buf *b, const struct tap_metrics_tally *t)
{
	family(b, "exchange_publishes_total", COUNTER,
	       "Publish records by exchange and route for the " TAP_METRICS_STR(TAP_METRICS_EXCHANGES)
	       " busiest exchanges, each counted since it got its series; every other publish in exchange=\""
	       EXCHANGE_OTHER "\". The default exchange is \"" EXCHANGE_DEFAULT "\". In a name a byte that is not "
	       "UTF-8 shows as \\\\xHH, a backslash doubled, and a leading ( gets a backslash before it.");
	char label[4 * sizeof t->exchanges[0].name + 1];
	for (size_t i = 0; i < t->n_exchanges; i++) {
		const struct tap_metrics_exchange *e = &t->exchanges[i];
		if (!e->labelled)
			continue;
		if (e->len == 0)
			exchange_routes(b, EXCHANGE_DEFAULT, strlen(EXCHANGE_DEFAULT), e->by_route);
		else
			exchange_routes(b, label, exchange_label(label, e->name, e->len), e->by_route);
	}
	exchange_routes(b, EXCHANGE_OTHER, strlen(EXCHANGE_OTHER), t->other_by_route);
}

static void render_capture(struct tap_buf *b, const struct tap_metrics_snapshot *s)
{
	if (!s->have_capture)
		return;
	family(b, "capture_packets_total", COUNTER, "Packets the capture handed to the TCP reassembly.");
	tap_buf_printf(b, "amqptap_capture_packets_total %" PRIu64 "\n", s->capture_packets);
	family(b, "capture_drops_total", COUNTER, "Packets the kernel or the interface dropped (pcap_stats).");
	tap_buf_printf(b, "amqptap_capture_drops_total %" PRIu64 "\n", s->capture_drops);
	family(b, "capture_gaps_total", COUNTER, "Holes in a captured stream direction (capture_gap records).");
	tap_buf_printf(b, "amqptap_capture_gaps_total %" PRIu64 "\n", s->capture_gaps);
	family(b, "capture_gap_bytes_total", COUNTER, "Stream bytes the capture gaps lost.");
	tap_buf_printf(b, "amqptap_capture_gap_bytes_total %" PRIu64 "\n", s->capture_gap_bytes);
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

	family(b, "connections_closed_total", COUNTER,
	       "Connections ended, by their close record's \"by\" (client or broker: a connection.close; else how the "
	       "TCP connection or capture ended).");
	for (int i = 0; i < TAP_METRICS_N_CLOSE_BY; i++)
		labelled(b, "connections_closed_total", "by", tap_metrics_close_by_names[i], t->closed_by[i]);

	family(b, "records_lost_total", COUNTER, "Records not written, by reason.");
	labelled(b, "records_lost_total", "reason", "no_memory", s->track.records_oom);
	family(b, "output_records_lost_total", COUNTER,
	       "Records an output dropped whole, by reason (backlog_full: written slower than they came; no_memory; "
	       "write_failed; unflushed: not written by the stop's deadline).");
	for (size_t i = 0; i < TAP_METRICS_N_OUT; i++) {
		if (!s->out[i].on)
			continue;
		for (int r = 0; r < TAP_OUT_N_LOSSES; r++)
			labelled2(b, "output_records_lost_total", "output", out_names[i], "reason",
				  tap_out_loss_name((enum tap_out_loss)r), s->out[i].lost_by[r]);
	}
	family(b, "output_write_errors_total", COUNTER, "Failed writes to an output file (the buffered lines are dropped).");
	for (size_t i = 0; i < TAP_METRICS_N_OUT; i++)
		if (s->out[i].on)
			labelled(b, "output_write_errors_total", "output", out_names[i], s->out[i].write_errors);

	family(b, "forwarded_bytes_total", COUNTER, "Bytes forwarded, by direction (c2s: client to broker).");
	labelled(b, "forwarded_bytes_total", "dir", "c2s", s->bytes[TAP_C2S]);
	labelled(b, "forwarded_bytes_total", "dir", "s2c", s->bytes[TAP_S2C]);

	render_hist(b, "confirm_latency_seconds",
	            "Time from the publish's last frame forwarded to the broker to its Basic.Ack or Basic.Nack.", &s->confirm);
	struct tap_metrics_hist ret;
	memset(&ret, 0, sizeof ret);
	tap_metrics_hist_fold(&ret, &t->return_us);
	render_hist(b, "return_latency_seconds",
	            "Time from the publish's last frame forwarded to the broker to its Basic.Return.", &ret);
	render_exchanges(b, t);
	render_capture(b, s);

	family(b, "listening", GAUGE, "1 while the AMQP listener accepts clients, 0 while shutting down.");
	tap_buf_printf(b, "amqptap_listening %d\n", s->listening ? 1 : 0);
	if (t->upstream != TAP_UPSTREAM_UNSEEN) {
		family(b, "upstream_up", GAUGE,
		       "1 if the broker answered the last connection attempt, 0 if unreachable or its TLS failed.");
		tap_buf_printf(b, "amqptap_upstream_up %d\n", t->upstream == TAP_UPSTREAM_REACHABLE ? 1 : 0);
	}
	family(b, "build_info", GAUGE, "Always 1; the version, the tap id and the run id of its records in labels.");
	labelled_n(b, "build_info",
		   (const char *const[]){"version", s->version ? s->version : "", "tap", s->tap_id ? s->tap_id : "",
					 "run", s->run ? s->run : ""},
		   3, 1);
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
	if (t->upstream == TAP_UPSTREAM_UNREACHABLE) /* how: "unreachable" or "broker_tls_error" */
		tap_json_kv_str(j, "upstream_failure", tap_metrics_close_by_names[t->upstream_failure]);
}

static void json_head(struct tap_json *j, const struct tap_metrics_snapshot *s, const struct tap_metrics_tally *t)
{
	tap_json_kv_str(j, "status", s->listening ? "ok" : "stopping");
	tap_json_kv_bool(j, "listening", s->listening);
	json_seconds(j, "uptime_seconds", s->now_us - s->start_us);
	tap_json_kv_str(j, "version", s->version ? s->version : "");
	tap_json_kv_str(j, "tap", s->tap_id ? s->tap_id : "");
	tap_json_kv_str(j, "run", s->run ? s->run : "");
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

static void json_routes(struct tap_json *j, const uint64_t *by_route)
{
	for (size_t r = 0; r < TAP_METRICS_N_ROUTES; r++)
		tap_json_kv_uint(j, route_names[r], by_route[r]);
}

/* Exchanges with their own series (the default one named ""), then the rest. */
static void json_exchanges(struct tap_json *j, const struct tap_metrics_tally *t)
{
	tap_json_key(j, "exchanges");
	tap_json_obj_begin(j);
	tap_json_key(j, "rows");
	tap_json_arr_begin(j);
	for (size_t i = 0; i < t->n_exchanges; i++) {
		const struct tap_metrics_exchange *e = &t->exchanges[i];
		if (!e->labelled)
			continue;
		tap_json_obj_begin(j);
		tap_json_key(j, "exchange");
		tap_json_strn(j, e->name, e->len);
		json_routes(j, e->by_route);
		tap_json_obj_end(j);
	}
	tap_json_arr_end(j);
	tap_json_key(j, "other");
	tap_json_obj_begin(j);
	json_routes(j, t->other_by_route);
	tap_json_obj_end(j);
	tap_json_obj_end(j);
}

static void json_return_latency(struct tap_json *j, const struct tap_metrics_tally *t)
{
	tap_json_key(j, "return_latency");
	tap_json_obj_begin(j);
	tap_json_kv_uint(j, "count", t->return_us.n);
	tap_json_kv_uint(j, "p50_us", tap_hist_quantile(&t->return_us, 0.5));
	tap_json_kv_uint(j, "p99_us", tap_hist_quantile(&t->return_us, 0.99));
	tap_json_kv_uint(j, "max_us", t->return_us.max);
	tap_json_obj_end(j);
}

static void json_capture(struct tap_json *j, const struct tap_metrics_snapshot *s)
{
	tap_json_key(j, "capture");
	if (!s->have_capture) {
		tap_json_null(j);
		return;
	}
	tap_json_obj_begin(j);
	tap_json_kv_uint(j, "packets", s->capture_packets);
	tap_json_kv_uint(j, "drops", s->capture_drops);
	tap_json_kv_uint(j, "gaps", s->capture_gaps);
	tap_json_kv_uint(j, "gap_bytes", s->capture_gap_bytes);
	tap_json_obj_end(j);
}

/* "lost_by": {reason: n}, the reasons that lost any. */
static void json_lost_by(struct tap_json *j, const struct tap_metrics_output *o)
{
	tap_json_key(j, "lost_by");
	tap_json_obj_begin(j);
	for (int r = 0; r < TAP_OUT_N_LOSSES; r++)
		if (o->lost_by[r])
			tap_json_kv_uint(j, tap_out_loss_name((enum tap_out_loss)r), o->lost_by[r]);
	tap_json_obj_end(j);
}

/* "outputs": records written, dropped whole (and why) and failed writes of each output that is on */
static void json_outputs(struct tap_json *j, const struct tap_metrics_snapshot *s)
{
	tap_json_key(j, "outputs");
	tap_json_obj_begin(j);
	for (size_t i = 0; i < TAP_METRICS_N_OUT; i++) {
		if (!s->out[i].on)
			continue;
		tap_json_key(j, out_names[i]);
		tap_json_obj_begin(j);
		tap_json_kv_uint(j, "records", s->out[i].lines);
		tap_json_kv_uint(j, "lost", s->out[i].lost);
		json_lost_by(j, &s->out[i]);
		tap_json_kv_uint(j, "write_errors", s->out[i].write_errors);
		tap_json_obj_end(j);
	}
	tap_json_obj_end(j);
}

/* "connections_closed_by": the ways connections ended that happened, with their counts */
static void json_closed_by(struct tap_json *j, const struct tap_metrics_tally *t)
{
	tap_json_key(j, "connections_closed_by");
	tap_json_obj_begin(j);
	for (int i = 0; i < TAP_METRICS_N_CLOSE_BY; i++)
		if (t->closed_by[i])
			tap_json_kv_uint(j, tap_metrics_close_by_names[i], t->closed_by[i]);
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
	tap_json_kv_uint(&j, "records_lost", s->track.records_oom);
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
	json_return_latency(&j, t);
	json_exchanges(&j, t);
	json_capture(&j, s);
	json_outputs(&j, s);
	json_closed_by(&j, t);

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
