/* The tally the tracker's verdict and connection hooks feed (tap_metrics_tally_*): returns by reply code, return
 * latency, publishes by exchange and deliveries by queue (Space-Saving), the last problem publishes and missing
 * resends, the upstream's state. */
#include "metrics_int.h"

#include "amqptap/identity.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

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


static void keep_problem(struct tap_metrics_tally *t, const struct tap_track_verdict *v)
{
	struct tap_metrics_problem *p = &t->problems[t->problem_next];
	t->problem_next = (t->problem_next + 1) % TAP_METRICS_PROBLEMS;
	t->problems_seen++;
	if (v->record.ptr && v->record.len <= sizeof p->json) {
		/* without what --header-values asked for, which is for the files only: the tracker says where it is */
		bool cut = v->values_len && v->values_at + v->values_len <= v->record.len;
		size_t cut_at = cut ? v->values_at : v->record.len;
		size_t cut_end = cut ? cut_at + v->values_len : cut_at;
		memcpy(p->json, v->record.ptr, cut_at);
		memcpy(p->json + cut_at, v->record.ptr + cut_end, v->record.len - cut_end);
		p->len = (uint16_t)(v->record.len - (cut_end - cut_at));
		return;
	}
	int n = snprintf(p->json, sizeof p->json,
	                 "{\"type\":\"publish\",\"conn\":%" PRIu64 ",\"channel\":%u,\"route\":\"%s\",\"confirm\":\"%s\","
	                 "\"truncated\":true,\"bytes\":%zu}",
	                 v->conn, v->channel, metrics_route_names[v->route], metrics_confirm_names[v->confirm], v->record.len);
	p->len = n > 0 && (size_t)n < sizeof p->json ? (uint16_t)n : 0;
}

_Static_assert(TAP_METRICS_N_ROUTES + 1 <= TAP_METRICS_TOP_COUNTS && TAP_CONSUME_N_OUTCOMES <= TAP_METRICS_TOP_COUNTS,
               "a name's counters hold every route and dropped, and every delivery outcome");

static bool same_name(const struct tap_metrics_top_name *e, struct tap_slice x)
{
	return e->len == x.len && memcmp(e->name, x.ptr, x.len) == 0;
}

/* The candidate slot of name x: found, new, or (Space-Saving) the least counted one without a series, which x
 * inherits with its count. */
static struct tap_metrics_top_name *top_slot(struct tap_metrics_top *top, struct tap_slice x)
{
	if (top->n && same_name(&top->names[top->last], x))
		return &top->names[top->last];
	size_t at = top->n;
	for (size_t i = 0; i < top->n; i++) {
		if (same_name(&top->names[i], x)) {
			top->last = i;
			return &top->names[i];
		}
	}
	uint64_t inherited = 0;
	if (at == TAP_METRICS_EXCHANGE_CANDIDATES) {
		for (size_t i = 0; i < TAP_METRICS_EXCHANGE_CANDIDATES; i++)
			if (!top->names[i].labelled && (at == TAP_METRICS_EXCHANGE_CANDIDATES ||
			                                top->names[i].seen < top->names[at].seen))
				at = i;
		inherited = top->names[at].seen;
	} else {
		top->n++;
	}
	struct tap_metrics_top_name *e = &top->names[at];
	memset(e, 0, sizeof *e);
	e->len = (uint8_t)(x.len < sizeof e->name ? x.len : sizeof e->name);
	memcpy(e->name, x.ptr, e->len);
	e->seen = inherited;
	e->inherited = inherited;
	if (top->n_labelled < TAP_METRICS_EXCHANGES) { /* a free series: counted exactly from its first one */
		e->labelled = true;
		top->n_labelled++;
	}
	top->last = at;
	return e;
}

/* One more of name x, counted k: in its series, or in "(other)". */
static void top_count(struct tap_metrics_top *top, struct tap_slice x, unsigned k)
{
	if (!x.ptr)
		x = (struct tap_slice){(const uint8_t *)"", 0};
	struct tap_metrics_top_name *e = top_slot(top, x);
	e->seen++;
	if (e->labelled)
		e->by[k]++;
	else
		top->other[k]++;
}

static void count_exchange(struct tap_metrics_tally *t, const struct tap_track_verdict *v)
{
	top_count(&t->exchanges, v->exchange, v->route);
	if (v->dropped_by_topology) { /* --definitions: counted beside its route (top_count found it last) */
		t->topology = true;
		struct tap_metrics_top_name *e = &t->exchanges.names[t->exchanges.last];
		if (e->labelled)
			e->by[TAP_METRICS_DROPPED]++;
		else
			t->exchanges.other[TAP_METRICS_DROPPED]++;
	}
}

void tap_metrics_tally_delivery(void *tally, struct tap_slice queue, enum tap_consume_outcome outcome)
{
	struct tap_metrics_tally *t = tally;
	top_count(&t->queues, queue, outcome);
}

void tap_metrics_tally_missing(void *tally, struct tap_slice record)
{
	struct tap_metrics_tally *t = tally;
	struct tap_metrics_problem *p = &t->missing[t->missing_next];
	t->missing_next = (t->missing_next + 1) % TAP_METRICS_MISSING;
	t->missing_seen++;
	if (record.ptr && record.len <= sizeof p->json) {
		memcpy(p->json, record.ptr, record.len);
		p->len = (uint16_t)record.len;
		return;
	}
	int n = snprintf(p->json, sizeof p->json, "{\"type\":\"resend_missing\",\"truncated\":true,\"bytes\":%zu}",
	                 record.len);
	p->len = n > 0 && (size_t)n < sizeof p->json ? (uint16_t)n : 0;
}

void tap_metrics_tally_verdict(void *tally, const struct tap_track_verdict *v)
{
	struct tap_metrics_tally *t = tally;
	count_exchange(t, v);
	if (v->repeat == (int)TAP_REPEAT_RESEND)
		tap_hist_add(&t->resend_us, v->repeat_ago_us);
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

static uint64_t certain(const struct tap_metrics_top_name *e)
{
	return e->seen - e->inherited;
}

/* The candidate without a series that has the highest certain count, or the one with a series with the lowest. */
static struct tap_metrics_top_name *extreme(struct tap_metrics_top *top, bool labelled)
{
	struct tap_metrics_top_name *best = NULL;
	for (size_t i = 0; i < top->n; i++) {
		struct tap_metrics_top_name *e = &top->names[i];
		if (e->labelled != labelled)
			continue;
		if (!best || (labelled ? certain(e) < certain(best) : certain(e) > certain(best)))
			best = e;
	}
	return best;
}

static void top_rank(struct tap_metrics_top *top)
{
	for (size_t swaps = 0; swaps < TAP_METRICS_EXCHANGES; swaps++) {
		struct tap_metrics_top_name *in = extreme(top, false);
		struct tap_metrics_top_name *out = extreme(top, true);
		if (!in || (out && certain(in) <= certain(out) + certain(out) / 8))
			return;
		if (out) { /* its series ends; what it counts goes to "(other)" from now on */
			out->labelled = false;
			memset(out->by, 0, sizeof out->by);
		} else {
			top->n_labelled++;
		}
		in->labelled = true;
	}
}

void tap_metrics_tally_rank(struct tap_metrics_tally *t)
{
	top_rank(&t->exchanges);
	top_rank(&t->queues);
}
