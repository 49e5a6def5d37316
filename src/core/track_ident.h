/* The identity table (track_ident.c, a consumer of the store beside the warning rules): which identities this
 * process has written publish records for, so that a publish of one seen before says which attempt it is and what
 * became of the one before (src/DESIGN.md §4b), and an unknown publish nobody resends within --resend-window gets a
 * `resend_missing` record. It changes no verdict. */
#ifndef AMQPTAP_TRACK_IDENT_H
#define AMQPTAP_TRACK_IDENT_H

#include "track_int.h"

#include "amqptap/identity.h"

/* Of conf.max_memory, the identity table takes at most this share (1/8: 32 MiB by default); the rest stays for
 * outstanding publishes, which the table never evicts. */
#define TRK_IDENT_SHARE_DIV 8u
/* The message_id an unresolved identity keeps for its resend_missing record, at most. */
#define TRK_IDENT_ID_MAX 255u

/* The publish record of v (verdict vd) is about to be written: r tells whether and how its identity was seen
 * before (r->seen false: its first attempt, or no identity); the table then holds it as the latest attempt. */
void trk_ident_publish(struct tap_track *t, const struct tap_track_conn *c, uint16_t ch, const struct trk_view *v,
                       const struct trk_verdict *vd, int64_t now_us, struct trk_repeat *r);
/* Writes the resend_missing records whose window is over, forgets settled identities past it; returns the next
 * deadline (INT64_MAX: none). */
int64_t trk_ident_tick(struct tap_track *t, int64_t now_us);
/* Every unresolved identity gets its resend_missing record now ("window_over": false). */
void trk_ident_shutdown(struct tap_track *t, int64_t now_us);
void trk_ident_free(struct tap_track *t);

#endif
