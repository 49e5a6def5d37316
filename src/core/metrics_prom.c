/* The Prometheus text exposition format 0.0.4 of /metrics, from a snapshot and the tally. */
#include "metrics_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char *const type_names[] = {"counter", "gauge", "histogram"};

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

/* The label values of the pseudo exchanges and queues (an empty label value would mean no label at all to
 * Prometheus). RabbitMQ takes any shortstr as a name, these too: exchange_label keeps real names off them. */
#define EXCHANGE_DEFAULT "(AMQP default)"
#define NAME_OTHER "(other)"
#define QUEUE_UNKNOWN "(unknown)"

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

/* The label value of name (QUEUE_UNKNOWN or EXCHANGE_DEFAULT for ""), escaped for the text format. */
static void name_label(struct tap_buf *b, const struct tap_metrics_top_name *e, const char *empty)
{
	char label[4 * sizeof e->name + 1];
	if (e->len)
		label_valuen(b, label, exchange_label(label, e->name, e->len));
	else
		label_valuen(b, empty, strlen(empty));
}

/* One sample per counter k < n of every name with a series, then of "(other)": NAME{KIND="...",BY="..."} v. */
static void top_samples(struct tap_buf *b, const struct tap_metrics_top *top, const char *family_name, const char *kind,
                        const char *empty, const char *by, const char *const *values, size_t first, size_t n)
{
	for (size_t i = 0; i <= top->n; i++) {
		const struct tap_metrics_top_name *e = i < top->n ? &top->names[i] : NULL;
		if (e && !e->labelled)
			continue;
		for (size_t k = first; k < first + n; k++) {
			tap_buf_printf(b, "amqptap_%s{%s=\"", family_name, kind);
			if (e)
				name_label(b, e, empty);
			else
				tap_buf_puts(b, NAME_OTHER);
			tap_buf_puts(b, "\"");
			if (by)
				tap_buf_printf(b, ",%s=\"%s\"", by, values[k - first]);
			tap_buf_printf(b, "} %" PRIu64 "\n", e ? e->by[k] : top->other[k]);
		}
	}
}

static void render_exchanges(struct tap_buf *b, const struct tap_metrics_tally *t)
{
	family(b, "exchange_publishes_total", COUNTER,
	       "Publish records by exchange and route for the " TAP_METRICS_STR(TAP_METRICS_EXCHANGES)
	       " busiest exchanges, each counted since it got its series; every other publish in exchange=\""
	       NAME_OTHER "\". The default exchange is \"" EXCHANGE_DEFAULT "\". In a name a byte that is not "
	       "UTF-8 shows as \\\\xHH, a backslash doubled, and a leading ( gets a backslash before it.");
	top_samples(b, &t->exchanges, "exchange_publishes_total", "exchange", EXCHANGE_DEFAULT, "route",
	            metrics_route_names, 0, TAP_METRICS_N_ROUTES);
	if (!t->topology)
		return;
	/* --definitions: the alert on publishes the broker's topology drops, by the same exchanges' series */
	family(b, "exchange_dropped_by_topology_total", COUNTER,
	       "Publishes not mandatory that the --definitions model routes to no queue (dropped_by_topology), by "
	       "exchange, for the exchanges of exchange_publishes_total.");
	top_samples(b, &t->exchanges, "exchange_dropped_by_topology_total", "exchange", EXCHANGE_DEFAULT, NULL, NULL,
	            TAP_METRICS_DROPPED, 1);
}

static void render_queues(struct tap_buf *b, const struct tap_metrics_tally *t)
{
	static const char *outcomes[TAP_CONSUME_N_OUTCOMES];
	for (int o = 0; o < TAP_CONSUME_N_OUTCOMES; o++)
		outcomes[o] = tap_consume_outcome_name((enum tap_consume_outcome)o);
	family(b, "queue_deliveries_total", COUNTER,
	       "delivery records by queue and outcome for the " TAP_METRICS_STR(TAP_METRICS_EXCHANGES)
	       " busiest queues, each counted since it got its series; every other delivery in queue=\"" NAME_OTHER
	       "\"; a get-ok whose basic.get the tap did not see in queue=\"" QUEUE_UNKNOWN "\". Names are written as "
	       "exchange_publishes_total's.");
	top_samples(b, &t->queues, "queue_deliveries_total", "queue", QUEUE_UNKNOWN, "outcome", outcomes, 0,
	            TAP_CONSUME_N_OUTCOMES);
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

/* --definitions or --management: how reading the model goes and how old the one in use is. Both results are there
 * from the start (an alert on increase() sees the first failure); the model's gauges only while there is one. */
static void render_topology(struct tap_buf *b, const struct tap_metrics_snapshot *s)
{
	const struct tap_metrics_topology *t = &s->topology;
	if (!t->on)
		return;
	family(b, "topology_polls_total", COUNTER,
	       "Reads of the broker's definitions by result: each --management poll, --definitions at start and on "
	       "SIGHUP. A failed one keeps the model in use.");
	labelled(b, "topology_polls_total", "result", "ok", t->polls_ok);
	labelled(b, "topology_polls_total", "result", "failed", t->polls_failed);
	if (!t->loaded_us)
		return;
	int64_t age = s->now_us - t->loaded_us;
	family(b, "topology_age_seconds", GAUGE, "Seconds since the routing model in use was loaded.");
	tap_buf_printf(b, "amqptap_topology_age_seconds %.3f\n", (double)(age > 0 ? age : 0) / 1e6);
	family(b, "topology_exchanges", GAUGE, "Exchanges in the routing model in use (the predeclared ones included).");
	tap_buf_printf(b, "amqptap_topology_exchanges %" PRIu64 "\n", t->exchanges);
	family(b, "topology_queues", GAUGE, "Queues in the routing model in use.");
	tap_buf_printf(b, "amqptap_topology_queues %" PRIu64 "\n", t->queues);
	family(b, "topology_bindings", GAUGE, "Bindings in the routing model in use.");
	tap_buf_printf(b, "amqptap_topology_bindings %" PRIu64 "\n", t->bindings);
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

	family(b, "delivery_outcomes_total", COUNTER,
	       "delivery records by outcome: ack, nack, reject, auto_ack, unknown (the channel or connection ended).");
	for (int o = 0; o < TAP_CONSUME_N_OUTCOMES; o++)
		labelled(b, "delivery_outcomes_total", "outcome", tap_consume_outcome_name((enum tap_consume_outcome)o),
		         s->consume.by_outcome[o]);

	family(b, "returns_total", COUNTER, "Returned publish records by the Basic.Return reply code.");
	for (size_t i = 0; i < t->n_codes; i++) {
		char code[8];
		snprintf(code, sizeof code, "%u", t->codes[i]);
		labelled(b, "returns_total", "reply_code", code, t->returns_by_code[i]);
	}
	if (t->returns_other_code)
		labelled(b, "returns_total", "reply_code", "other", t->returns_other_code);

	family(b, "warnings_total", COUNTER, "Publisher and consumer anti-pattern warnings by rule.");
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
			labelled2(b, "output_records_lost_total", "output", metrics_out_names[i], "reason",
				  tap_out_loss_name((enum tap_out_loss)r), s->out[i].lost_by[r]);
	}
	family(b, "output_write_errors_total", COUNTER, "Failed writes to an output file (the buffered lines are dropped).");
	for (size_t i = 0; i < TAP_METRICS_N_OUT; i++)
		if (s->out[i].on)
			labelled(b, "output_write_errors_total", "output", metrics_out_names[i], s->out[i].write_errors);

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
	memset(&ret, 0, sizeof ret);
	tap_metrics_hist_fold(&ret, &t->resend_us);
	render_hist(b, "resend_delay_seconds",
	            "Time from a publish that ended unknown, nacked or returned to its resend (the same identity).", &ret);
	render_hist(b, "settle_latency_seconds",
	            "Time from a delivery's last frame forwarded to the consumer to its ack, nack or reject.", &s->settle);
	render_hist(b, "queue_time_seconds",
	            "Time from a publish forwarded to the broker to its delivery forwarded to a consumer (queue_us), for "
	            "the deliveries linked to a publish this tap saw.", &s->queue);
	render_exchanges(b, t);
	render_queues(b, t);
	render_capture(b, s);
	render_topology(b, s);
	if (s->have_faults) { /* --fault */
		family(b, "faults_total", COUNTER, "Times a --fault rule acted, by action.");
		for (int a = 0; a < TAP_FAULT_ACTIONS; a++)
			if (a <= TAP_FAULT_KILL || s->faults[a])
				labelled(b, "faults_total", "action", tap_fault_action_name((enum tap_fault_action)a),
					 s->faults[a]);
	}

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
