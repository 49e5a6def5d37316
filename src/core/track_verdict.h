/* The lifecycle of an outstanding publish (track_verdict.c): verdict_of decides, trk_slot_step moves a slot
 * through the states drawn in track_int.h, and every publish ends in exactly one `publish` record, counted and
 * shown to the verdict hook there. Below it: the store, the records, the warning rules. */
#ifndef AMQPTAP_TRACK_VERDICT_H
#define AMQPTAP_TRACK_VERDICT_H

#include "track_int.h"

/* What ev does to the publish in slot e: the state it moves to, and for DONE the verdict its record is written
 * with. Reads e, changes nothing. */
enum trk_state trk_verdict_of(const struct trk_slot *e, enum trk_event ev, const struct trk_reason *why,
                              struct trk_verdict *vd);
/* The one place a publish ends: its record is written on channel id, counted and shown to the verdict hook. */
void trk_publish_done(struct tap_track_conn *c, uint16_t id, const struct trk_view *v, const struct trk_verdict *vd,
                      int64_t now_us);
/* Applies ev to outstanding slot n: it waits on, is held, or its record is written (stamped stamp_us) and it is
 * released. */
void trk_slot_step(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n, enum trk_event ev,
                   const struct trk_reason *why, int64_t stamp_us);

/* Whatever would have decided what ch still waits for was lost: each such publish ends now (TRK_EVENT_GAP, reason
 * why). The channel is pinned meanwhile, so that its ring keeps its place while slots are released. */
/* Every publish ch still waits for, each given flags first (TRK_FLAG_SEQ_LOST, or 0). */
void trk_chan_end_all_waiting(struct tap_track_conn *c, struct trk_chan *ch, uint32_t flags,
                              const struct trk_reason *why, int64_t now_us);
/* Only its mandatory publishes not returned yet (any of them may be the one a Return is for). */
void trk_chan_end_mandatory_waiting(struct tap_track_conn *c, struct trk_chan *ch, const struct trk_reason *why,
                                    int64_t now_us);

#endif
