/* A message's identity across reconnects (src/DESIGN.md §4b): its message_id, else a fingerprint (XXH3, libxxhash) of
 * its exchange, routing key, the properties a resend keeps (every one but timestamp) and its body. The body is
 * hashed as its frames pass, never kept. What a repeat of an identity is, given how its previous attempt ended, is
 * decided here for the live tap and for `amqptap audit` alike. Pure core: no I/O. */
#ifndef AMQPTAP_IDENTITY_H
#define AMQPTAP_IDENTITY_H

#include "amqptap/props.h"
#include "amqptap/track.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --identity */
enum tap_identity_mode {
	TAP_IDENTITY_AUTO = 0,   /* the message_id when it has one (not empty), else the fingerprint */
	TAP_IDENTITY_MESSAGE_ID, /* the message_id only: a publish without one has no identity */
	TAP_IDENTITY_BODY,       /* the fingerprint always (the message_id is one of its properties) */
	TAP_IDENTITY_OFF,        /* none: no identity member, no repeats, no resend_missing */
};

/* How an identity was made; as text its prefix: "id:" or "fp:", then 16 lowercase hex digits. */
enum tap_identity_kind {
	TAP_IDENTITY_NONE = 0,
	TAP_IDENTITY_ID,
	TAP_IDENTITY_FINGERPRINT,
};
#define TAP_IDENTITY_TEXT_LEN 19u

/* The identity of a message_id. */
uint64_t tap_identity_of_id(const uint8_t *id, size_t len);
/* The fingerprint's seed from what precedes the body: exchange, routing key and the properties but timestamp, from
 * the content header's payload as sent and props as tap_props_decode read it from there (TAP_OK). */
uint64_t tap_identity_head(struct tap_slice exchange, struct tap_slice routing_key, const uint8_t *payload,
                           size_t len, const struct tap_props *props);
/* The fingerprint of a body that came in one piece. */
uint64_t tap_identity_body(uint64_t head, const uint8_t *body, size_t len);

/* A body that comes in pieces: the same fingerprint as tap_identity_body of the whole. */
struct tap_identity_stream;
/* The stream's size, as the caller counts it in its memory. */
size_t tap_identity_stream_size(void);
struct tap_identity_stream *tap_identity_stream_new(void); /* NULL when out of memory */
void tap_identity_stream_free(struct tap_identity_stream *s);
void tap_identity_stream_reset(struct tap_identity_stream *s, uint64_t head);
void tap_identity_stream_update(struct tap_identity_stream *s, const uint8_t *p, size_t len);
uint64_t tap_identity_stream_digest(const struct tap_identity_stream *s);

/* out gets TAP_IDENTITY_TEXT_LEN characters and a NUL. */
void tap_identity_format(char out[TAP_IDENTITY_TEXT_LEN + 1], enum tap_identity_kind kind, uint64_t h);
/* The inverse; false when s is no identity text. */
bool tap_identity_parse(const char *s, size_t len, enum tap_identity_kind *kind, uint64_t *h);

/* What a publish of an identity seen before is, by how the previous attempt ended. */
enum tap_identity_repeat {
	TAP_REPEAT_RESEND,     /* the previous ended unknown, nacked or returned: the at-least-once resend */
	TAP_REPEAT_DUPLICATE,  /* the previous was acked or routed: a consumer gets it twice */
	TAP_REPEAT_UNVERIFIED, /* no confirm (nor mandatory routing) told what became of the previous */
};
enum tap_identity_repeat tap_identity_classify(enum tap_track_route prev_route, enum tap_track_confirm prev_confirm);
const char *tap_identity_repeat_name(enum tap_identity_repeat r);
/* Whether a publish that ended so is one the publisher must resend (a resend_missing when it does not): its
 * confirm is unknown (the connection or channel died first), unless the tap itself gave up on it (reason_by
 * "evicted" or "no_memory": the broker may well have answered the client). */
bool tap_identity_wants_resend(enum tap_track_confirm confirm, const char *reason_by);

#endif
