/* The connection observer's own declarations (conn*.c), private to the core. The files call one way:
 *
 *   conn.c          the public tap_conn_* API: lifetime, feeding both decoders, capture gaps
 *   conn_method.c   decoded methods onto the tracker, frame_max, login state
 *   conn_content.c  publish and return content (header and body frames) onto tap_track_publish/_return
 *   conn_chan.c     the channel table and each channel's store of pending strings
 *   conn_record.c   decode_error and capture_gap records, and the frame trace
 *   conn_capture.c  the capture copy of the client stream: held bytes and redaction
 *
 * conn.c calls the others; conn_method.c calls conn_content.c, conn_chan.c, conn_record.c and conn_capture.c;
 * conn_content.c calls conn_chan.c; conn_chan.c, conn_record.c and conn_capture.c call none of them. */
#ifndef AMQPTAP_CONN_INT_H
#define AMQPTAP_CONN_INT_H

#include "amqptap/conn.h"
#include "amqptap/frame.h"
#include "amqptap/identity.h"
#include "amqptap/redact.h"
#include "amqptap/spec.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Content being assembled on one channel in one direction. */
enum pending_kind { PENDING_NONE, PENDING_PUBLISH, PENDING_RETURN, PENDING_DELIVER };

/* Strings of the pending method and its header, copied into `store`
 * because the decoder's buffers are only valid until the next feed. */
struct pending {
	enum pending_kind kind;
	bool ended; /* a content just ended here: the next frame on the channel must be a method */
	bool have_header;
	bool mandatory, immediate;
	uint16_t reply_code;
	uint64_t body_size, body_got;
	struct tap_buf store;
	/* offsets into store */
	struct span {
		uint32_t off, len;
	} exchange, routing_key, reply_text, message_id, correlation_id, content_type, type, app_id, user_id, headers;
	uint32_t header_keys_off, n_header_keys;
	bool headers_cut; /* a header field the records want was too long to keep whole */
	bool has_message_id, has_correlation_id, has_user_id, has_delivery_mode, has_timestamp;
	uint8_t delivery_mode;
	uint64_t timestamp;
	/* its identity (amqptap/identity.h): ident_kind set once known; while fp_on the fingerprint is being made,
	 * ident holding its seed, and fp_stream says the body is being fed to its channel's stream */
	uint8_t ident_kind;
	bool fp_on, fp_stream;
	uint64_t ident;
	/* PENDING_DELIVER: a basic.deliver or get-ok (its consumer tag in reply_text's span) */
	bool get, redelivered, has_delivery_count;
	int64_t delivery_count;
	uint64_t delivery_tag;
};

struct channel {
	uint16_t number;
	struct pending dir[TAP_DIR_COUNT];
	/* a fingerprint of a body that comes in more than one piece, per direction (a publish's and a delivery's may
	 * cross); made at the first such body and kept with the channel, counted in the observer's pending_mem */
	struct tap_identity_stream *fp[TAP_DIR_COUNT];
};

struct direction {
	struct tap_frame_dec dec;
	bool stopped;
	bool gapped; /* the capture lost bytes of this direction: decoding stopped there (tap_conn_gap) */
	uint64_t fed;     /* bytes fed so far: the stream offset of the next chunk */
	uint64_t decoded; /* the stream offset after the last whole frame decoded */
	struct tap_buf body_prefix; /* first body_bytes of the current body frame, for the trace */
	bool bad_method_seen; /* a method that did not decode got its decode_error record */
};


struct tap_conn {
	struct tap_observer *o;
	uint64_t id;
	struct tap_track_conn *tc;
	struct direction dir[TAP_DIR_COUNT];
	struct channel *chans; /* in the order they were first seen */
	size_t n_chans, cap_chans;
	size_t last_chan;
	/* channel number -> 1 + its index in chans (0: free), open addressing, cap a power of two at most half full:
	 * a client with thousands of channels costs a lookup per frame, not a scan */
	uint32_t *chan_index;
	size_t index_cap;
	uint64_t chans_charged; /* bytes of chans and chan_index counted in the tracker's memory budget */
	char *vhost; /* of the client's connection.open, until the broker's open-ok */
	size_t vhost_len;
	bool vhost_lost; /* out of memory for it: the tracker is told it is not known */
	bool login_done; /* the client's tune-ok or connection.open was decoded: no SASL exchange can follow */
	bool midstream;  /* a capture that began mid-connection (tap_conn_start_unseen): no login to wait for */
	enum tap_amqp_version version; /* of the client's protocol header, and the tune-ok's frame_max: a decoder */
	uint32_t frame_max;            /* restarted after a capture gap needs them */
	uint32_t broker_frame_max;     /* the broker's connection.tune: 0, no limit */
	uint32_t client_frame_max;     /* the client's tune-ok: 0, no limit */
	bool broker_tuned;             /* the broker's connection.tune was seen */
	bool tuned;
	void *capture;
	/* the capture copy of each stream, by enum tap_dir: the broker's is held only while the client logs in (a peer
	 * that echoes the client's bytes would otherwise put its password in the capture). Allocated only with an
	 * observer that captures (o->capture): a replay or a sniffer of 65,536 connections saves 350 bytes each. */
	struct capture_copy {
		struct tap_buf held; /* bytes held back, from held_offset on */
		uint64_t held_offset;
		struct tap_range redact[8]; /* stream offsets found while decoding the current chunk */
		size_t n_redact;
	} copy[];
};

/* Whether the client may still be logging in: its tune-ok or connection.open not decoded, in a stream followed from
 * its start with nothing lost (a capture begun mid-connection, or a client-side gap, may have had the login in
 * what the tap never saw). */
static inline bool conn_logging_in(const struct tap_conn *c)
{
	return !c->login_done && !c->midstream && !c->dir[TAP_C2S].gapped;
}

/* ---- conn_chan.c ---- */

/* Channel state, created on first use (a publish or a return: only content needs it). NULL when out of memory or
 * when the table's growth does not fit in the tracker's memory budget: the channel's contents are then not
 * assembled (a publish is handed over at its method). */
struct channel *conn_channel_get(struct tap_conn *c, uint16_t number, int64_t now_us);
/* The channel's state if it has any. */
struct channel *conn_channel_find(struct tap_conn *c, uint16_t number);
/* Forgets channel number at its close-ok unless a content is in progress on it. */
void conn_channel_drop(struct tap_conn *c, uint16_t number);
/* Appends to p's store, counted in the observer's pending_mem (nothing past its pending_max: the store is oom). */
void conn_store_put(const struct tap_conn *c, struct pending *p, const void *data, size_t len);
void conn_store_free(const struct tap_conn *c, struct tap_buf *store);
/* Frees the channel's fingerprint stream. */
void conn_fp_free(const struct tap_conn *c, struct channel *ch);
/* Copies s into p's store: where it is kept. (Inline, as the next: several times per publish.) */
static inline struct span conn_keep(const struct tap_conn *c, struct pending *p, const uint8_t *s, size_t len)
{
	struct span sp = {(uint32_t)p->store.len, (uint32_t)len};
	conn_store_put(c, p, s, len);
	return sp;
}

/* What sp names in p's store (empty when the store lost it). */
static inline struct tap_slice conn_span_slice(const struct pending *p, struct span sp)
{
	if (p->store.oom || !p->store.data)
		return (struct tap_slice){(const uint8_t *)"", 0};
	return (struct tap_slice){(const uint8_t *)p->store.data + sp.off, sp.len};
}
/* A channel's store keeps its room for the next content, up to this (a typical publish's strings fit): one content
 * with long strings must not hold memory on every channel it was sent on, nor fill the observer's pending_max with
 * room kept on thousands of idle channels. */
#define PENDING_STORE_KEEP 512

/* p starts over as kind, keeping some of its store's room. (Inline: twice per publish, and the compiler clears
 * only what it must of p where it sees the call.) */
static inline void conn_pending_reset(const struct tap_conn *c, struct pending *p, enum pending_kind kind)
{
	struct tap_buf store = p->store;
	/* and none once the observer's stores hold a sixteenth of its pending_max: 2,047 idle channels on each of 300
	 * connections kept 256 bytes each, 67 MB, past pending_max, so that later contents kept no details */
	if (store.cap > PENDING_STORE_KEEP || c->o->pending_mem > c->o->pending_max / 16)
		conn_store_free(c, &store);
	tap_buf_reset(&store);
	memset(p, 0, sizeof *p);
	p->store = store;
	p->kind = kind;
}

/* ---- conn_content.c ---- */

/* Content on channel that will never be finished: a publish still gets its record, a return is dropped. */
void conn_pending_cut(struct tap_conn *c, uint16_t channel, struct pending *p, int64_t now_us);
void conn_on_header(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int64_t now_us);
/* TAP_OK, or TAP_E_BODY_TOO_LONG: decoding of dir stops. */
int conn_on_body(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int64_t now_us);

/* ---- conn_method.c ---- */

void conn_on_method(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int64_t now_us);

/* ---- conn_record.c ---- */

/* A decode_error record for stream offset at of dir, showing what it may of chunk (see shown_bytes). */
void conn_decode_error(struct tap_conn *c, enum tap_dir dir, int status, uint64_t at, const uint8_t *chunk,
		       size_t chunk_len, uint64_t chunk_offset, int64_t now_us);
/* The first method of dir whose payload did not decode gets a decode_error record. */
void conn_bad_method(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int status, int64_t now_us);
/* A capture_gap record: missing bytes of dir lost from offset on. */
void conn_gap_record(struct tap_conn *c, enum tap_dir dir, uint64_t offset, uint64_t missing, int64_t now_us);
/* One line of the frame trace (a body frame's prefix is gathered until its last chunk). */
void conn_trace_frame(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev, int64_t now_us);

/* ---- conn_capture.c ---- */

/* Notes the secrets of method m of dir (decoded with status rc) for the capture copy of this chunk. */
void conn_redact_method(struct tap_conn *c, enum tap_dir dir, const struct tap_frame_ev *ev,
			const struct tap_method *m, int rc);
/* Hands the capture sink its copy of one chunk of dir at stream chunk_offset. */
void conn_capture_chunk(struct tap_conn *c, enum tap_dir dir, const uint8_t *data, size_t len, uint64_t chunk_offset,
			int64_t now_us);
/* The connection ended: bytes still held are overwritten and passed on, and the capture is closed. */
void conn_capture_close(struct tap_conn *c, const char *reason_by, int64_t now_us);

#endif
