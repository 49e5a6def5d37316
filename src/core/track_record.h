/* The tracker's records (track_record.c, a consumer of the store): each function builds one record of src/DESIGN.md §4
 * in t->render.rec from the tracker's state and changes none of it; trk_emit hands the record to the emit hook. */
#ifndef AMQPTAP_TRACK_RECORD_H
#define AMQPTAP_TRACK_RECORD_H

#include "track_int.h"

/* Counts the record in t->render and hands it to the emit callback (a record that had no memory is counted lost). */
static inline void trk_emit(struct tap_track *t)
{
	t->st.records++;
	if (t->render.rec.oom) {
		t->st.oom++;
		t->st.records_oom++;
		return;
	}
	t->emit(t->ctx, t->render.rec.data, t->render.rec.len);
}

/* Takes the identity members (tap_id, run, started_us) of conf. */
void trk_render_init(struct trk_render *r, const struct tap_track_conf *conf);
void trk_render_deinit(struct trk_render *r);
/* The `publish` record; rep (its identity seen before: attempt, repeat, previous) may be NULL. */
void trk_record_publish(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const struct trk_view *v,
                        const struct trk_verdict *vd, const struct trk_repeat *rep,
                        const struct trk_fault_mark *fault, int64_t now_us);
/* The `resend_missing` record of an unresolved identity: its window (µs) is over, or the process ends first. */
void trk_record_resend_missing(struct trk_render *r, const struct trk_ident_entry *e, int64_t window_us,
                               bool window_over, int64_t now_us);
/* A `fault` record: a rule acted on connection c. */
void trk_record_fault(struct trk_render *r, const struct tap_track_conn *c, const struct tap_fault_act *a,
                      int64_t now_us);
/* A publisher anti-pattern seen on publish seq of channel ch. */
void trk_record_warning(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const char *rule,
                        uint64_t seq, int64_t now_us);
/* duplicate_message_id on publish seq of channel ch: its message_id (cut to TAP_TRACK_DUP_ID_MAX bytes) and the
 * connection's first publish of it (first_seq 0: not in confirm mode). */
#define TAP_TRACK_DUP_ID_MAX 255u
void trk_record_duplicate_warning(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const char *rule,
                                  uint64_t seq, struct tap_slice message_id, uint16_t first_channel,
                                  uint64_t first_seq, int64_t now_us);
/* A Return as a warning: rule unmatched_return (seq_first 0), or ambiguous_return with the confirm sequence
 * numbers of the first and last of the n publishes it may belong to (0: not in confirm mode). */
void trk_record_return_warning(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch,
                               const struct tap_return *ret, const char *rule, uint64_t n, uint64_t seq_first,
                               uint64_t seq_last, int64_t now_us);
void trk_record_topology_warning(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const char *rule,
                                 uint64_t seq, struct tap_slice exchange, struct tap_slice routing_key,
                                 const char *broker, int64_t now_us);
void trk_record_channel(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const char *event,
                        int64_t now_us);
/* The channel's open; followed false: it did not fit in the memory budget, no state is kept for it (its
 * publishes are written unknown at once). */
void trk_record_channel_open(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, bool followed,
                             int64_t now_us);
/* culprit (NULL: none) is the JSON object of trk_render_culprit; timed_out (NULL: none) the delivery a consumer
 * timeout closed the channel for (consume.c), written as "timed_out_delivery". */
void trk_record_channel_close(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch,
                              const struct trk_reason *why, uint64_t unconfirmed, const char *culprit,
                              size_t culprit_len, const char *timed_out, size_t timed_out_len, int64_t now_us);
/* {"conn":..,"channel":..,"seq":..,"message_id":..,"exchange":..,"routing_key":..} of a refused publish. */
void trk_render_culprit(struct tap_buf *out, const struct tap_track_conn *c, uint16_t ch, const struct trk_view *v);
void trk_record_conn_open(struct trk_render *r, const struct tap_track_conn *c, int64_t now_us);
void trk_record_conn_close(struct trk_render *r, const struct tap_track_conn *c, const struct trk_reason *why,
                           int64_t now_us);
/* A `blocked` record (the broker's connection.blocked with its reason) or an `unblocked` one. */
enum trk_blocked_record {
	TRK_RECORD_UNBLOCKED,
	TRK_RECORD_BLOCKED,
};
void trk_record_blocked(struct trk_render *r, const struct tap_track_conn *c, enum trk_blocked_record which,
                        struct tap_slice reason, int64_t now_us);
/* The "conn", "client", "vhost", "user" members every publish record of c starts with, into c->prefix. */
void trk_render_prefix(struct tap_buf *prefix, const struct tap_track_conn *c);
/* What trk_render_extra found worth counting. */
enum trk_extra_note {
	TRK_EXTRA_KEYS_CUT = 1 << 0,     /* header keys cut to TAP_TRACK_HEADER_*_MAX */
	TRK_EXTRA_VALUES_CUT = 1 << 1,   /* header values cut to TAP_TRACK_HEADER_VALUE*_MAX */
	TRK_EXTRA_TRACE_BAD = 1 << 2,    /* a traceparent header that is no W3C traceparent: left out */
};
/* The optional members of a publish record (content_type, message_type, app_id, headers, header_values of the
 * comma-separated keys in header_values (NULL: none), trace_id and span_id), rendered once when it is published,
 * into out, and where out holds the header values; returns enum trk_extra_note bits. */
unsigned trk_render_extra(struct tap_buf *out, struct trk_values *values, const struct tap_publish *p,
                          const char *header_values);
/* The human summary of tap_track_summary. */
void trk_summary(const struct tap_track *t, struct tap_buf *out);

#endif
