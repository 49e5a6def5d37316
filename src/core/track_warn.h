/* The warning rules (track_warn.c, a consumer of the store and the records): every publisher anti-pattern of
 * src/DESIGN.md §4 is decided there, from the events the layers above hand in, and each `warning` record is written and
 * counted there. The rules change no verdict and call nothing above them. */
#ifndef AMQPTAP_TRACK_WARN_H
#define AMQPTAP_TRACK_WARN_H

#include "track_int.h"

/* A publish on ch (NULL: no memory for the channel) is about to be stored: the rules that look at publishes. */
void trk_warn_publish(struct tap_track_conn *c, struct trk_chan *ch, const struct tap_publish *p, int64_t now_us);
/* Slot e of ch leaves state WAIT (answered by ev, or ended) or HELD; call before its state changes. */
void trk_warn_settled(struct trk_chan *ch, const struct trk_slot *e, enum trk_event ev, int64_t now_us);
/* A publish record was written: an id whose publish the client may retransmit (nacked, returned, unknown) leaves
 * the window of recent ids, so the retransmission is no duplicate. */
void trk_warn_done(struct tap_track_conn *c, const struct trk_view *v, const struct trk_verdict *vd);

/* The warning record of rule is in t->render (written by a judge of its own, track_topo.c): emitted and counted. */
void trk_warn_written(struct tap_track *t, enum tap_track_rule rule);

/* Which bit of trk_warn_chan.warned says rule was written for the channel. */
static inline uint16_t trk_warn_bit(enum tap_track_rule rule)
{
	return (uint16_t)(1u << rule);
}
/* Writes rule for ch unless it was written for ch before. */
void trk_warn_once(struct tap_track_conn *c, struct trk_chan *ch, enum tap_track_rule rule, uint64_t seq,
                   int64_t now_us);

/* The publish of slot v on ch got verdict vd (its record written): the rules that look at verdicts, each once per
 * channel: confirm_without_mandatory (acked, not mandatory) and ack_before_return (its Return came after its ack).
 * Inline, as the rules' first test: it is made for every acked publish, and a rule once written costs no call. */
static inline void trk_warn_verdict(struct tap_track_conn *c, struct trk_chan *ch, const struct trk_view *v,
                                    const struct trk_verdict *vd, int64_t now_us)
{
	uint16_t warned = ch->warn.warned;
	if (vd->confirm == TAP_TRACK_CONFIRM_ACK && !v->mandatory &&
	    !(warned & trk_warn_bit(TAP_TRACK_RULE_CONFIRM_WITHOUT_MANDATORY)))
		trk_warn_once(c, ch, TAP_TRACK_RULE_CONFIRM_WITHOUT_MANDATORY, v->seq, now_us);
	if (vd->order == TAP_TRACK_ORDER_ACK_BEFORE_RETURN && !(warned & trk_warn_bit(TAP_TRACK_RULE_ACK_BEFORE_RETURN)))
		trk_warn_once(c, ch, TAP_TRACK_RULE_ACK_BEFORE_RETURN, v->seq, now_us);
}
/* A Return on channel id that no outstanding publish matches: unmatched_return. */
void trk_warn_unmatched_return(struct tap_track_conn *c, uint16_t id, const struct tap_return *r, int64_t now_us);
/* A Return n publishes of ch may be for, the first and last at slots first and last: ambiguous_return names them. */
void trk_warn_ambiguous_return(struct tap_track_conn *c, const struct trk_chan *ch, const struct tap_return *r,
                               uint64_t n, uint64_t first, uint64_t last, int64_t now_us);
/* ch ends (its close record is written; it is freed next). */
void trk_warn_chan_end(struct tap_track_conn *c, struct trk_chan *ch, int64_t now_us);
/* Frees what c keeps for the rules. */
void trk_warn_conn_free(struct tap_track_conn *c);

#endif
