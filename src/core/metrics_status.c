/* The JSON of /api/status behind the live status page, and the body of /healthz. */
#include "metrics_int.h"

#include "amqptap/consume.h"
#include "amqptap/fault_api.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

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

struct consumers_ctx {
	struct tap_json *j;
	int64_t now_us;
};

static void add_consumer(void *ctx, const struct tap_consume_consumer_info *k)
{
	struct consumers_ctx *r = ctx;
	struct tap_json *j = r->j;
	tap_json_obj_begin(j);
	tap_json_kv_uint(j, "conn", k->conn);
	tap_json_kv_uint(j, "channel", k->channel);
	tap_json_kv_strn(j, "tag", k->tag.ptr, k->tag.len);
	if (k->queue.ptr)
		tap_json_kv_strn(j, "queue", k->queue.ptr, k->queue.len);
	else
		tap_json_kv_null(j, "queue");
	tap_json_kv_bool(j, "no_ack", k->no_ack);
	tap_json_kv_uint(j, "prefetch", k->prefetch);
	tap_json_kv_bool(j, "global_qos", k->global_qos);
	tap_json_kv_uint(j, "deliveries", k->deliveries);
	if (!k->unacked_known)
		tap_json_kv_null(j, "unacked"); /* past the scan's bound, or no memory kept its tag */
	else
		tap_json_kv_uint(j, "unacked", k->unacked);
	if (k->unacked_known && k->unacked) {
		tap_json_kv_ts(j, "oldest_unacked", k->oldest_us);
		json_seconds(j, "oldest_unacked_age_seconds", r->now_us > k->oldest_us ? r->now_us - k->oldest_us : 0);
	}
	tap_json_kv_ts(j, "since", k->since_us);
	tap_json_obj_end(j);
}

/* The consumers of the live connections: {"total", "rows"} (at most TAP_METRICS_MAX_ROWS). */
static void json_consumers(struct tap_json *j, const struct tap_track *track, int64_t now_us)
{
	tap_json_key(j, "consumers");
	tap_json_obj_begin(j);
	tap_json_key(j, "rows");
	tap_json_arr_begin(j);
	struct consumers_ctx r = {.j = j, .now_us = now_us};
	uint64_t total =
		track ? tap_consume_each_consumer(track, TAP_METRICS_MAX_ROWS, TAP_METRICS_CONSUMER_SCAN, add_consumer, &r)
		      : 0;
	tap_json_arr_end(j);
	tap_json_kv_uint(j, "total", total);
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
		tap_json_kv_uint(j, metrics_route_names[r], by_route[r]);
}

/* Exchanges with their own series (the default one named ""), then the rest. */
static void json_exchanges(struct tap_json *j, const struct tap_metrics_tally *t)
{
	tap_json_key(j, "exchanges");
	tap_json_obj_begin(j);
	tap_json_key(j, "rows");
	tap_json_arr_begin(j);
	for (size_t i = 0; i < t->exchanges.n; i++) {
		const struct tap_metrics_top_name *e = &t->exchanges.names[i];
		if (!e->labelled)
			continue;
		tap_json_obj_begin(j);
		tap_json_key(j, "exchange");
		tap_json_strn(j, e->name, e->len);
		json_routes(j, e->by);
		tap_json_obj_end(j);
	}
	tap_json_arr_end(j);
	tap_json_key(j, "other");
	tap_json_obj_begin(j);
	json_routes(j, t->exchanges.other);
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
		tap_json_key(j, metrics_out_names[i]);
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

/* "faults": the rules in force (--fault, --fault-api), null when the tap has none and takes none */
static void json_faults(struct tap_json *j, const struct tap_metrics_snapshot *s)
{
	tap_json_key(j, "faults");
	if (!s->fault_set) {
		tap_json_null(j);
		return;
	}
	tap_json_obj_begin(j);
	tap_json_kv_bool(j, "api", s->fault_api);
	tap_json_kv_uint(j, "max", TAP_FAULT_RULES_MAX);
	tap_json_key(j, "rules");
	tap_fault_api_rules_json(j, s->fault_set);
	tap_json_obj_end(j);
}

/* A ring of records kept for the page: {"seen": how many there were, "rows": the kept ones, newest first}. */
static void json_kept(struct tap_json *j, const char *key, const struct tap_metrics_problem *ring, size_t cap,
                      uint64_t seen, size_t next)
{
	tap_json_key(j, key);
	tap_json_obj_begin(j);
	tap_json_kv_uint(j, "seen", seen);
	tap_json_key(j, "rows");
	tap_json_arr_begin(j);
	size_t kept = seen < cap ? (size_t)seen : cap;
	for (size_t i = 0; i < kept; i++) {
		const struct tap_metrics_problem *p = &ring[(next + cap - 1 - i) % cap];
		if (p->len)
			tap_json_raw(j, p->json, p->len);
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
	tap_json_kv_uint(&j, "records_lost", s->track.records_oom);
	tap_json_kv_uint(&j, "bytes_c2s", s->bytes[TAP_C2S]);
	tap_json_kv_uint(&j, "bytes_s2c", s->bytes[TAP_S2C]);
	tap_json_kv_uint(&j, "problems", t->problems_seen);
	tap_json_obj_end(&j);

	uint64_t rv[] = {s->track.routed, s->track.returned, s->track.unproven, s->track.unknown};
	json_counts(&j, "routes", metrics_route_names, rv, 4);
	uint64_t cv[] = {s->track.acked, s->track.nacked, s->track.confirm_none, s->track.confirm_unknown};
	json_counts(&j, "confirms", metrics_confirm_names, cv, 4);

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
	json_faults(&j, s);

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

	json_consumers(&j, track, s->now_us);
	json_kept(&j, "problems", t->problems, TAP_METRICS_PROBLEMS, t->problems_seen, t->problem_next);
	json_kept(&j, "resend_missing", t->missing, TAP_METRICS_MISSING, t->missing_seen, t->missing_next);
	tap_json_obj_end(&j);
}
