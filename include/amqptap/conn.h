/* The per-connection observer: two push decoders (client->broker and
 * broker->client) fed a copy of the forwarded bytes, content assembly per
 * channel (publish and return: method + header + body), and the mapping of
 * decoded methods onto the verdict tracker and the frame trace. Pure core:
 * the caller gives the bytes and the time. */
#ifndef AMQPTAP_CONN_H
#define AMQPTAP_CONN_H


#include "amqptap/dir.h"
#include "amqptap/jsonl.h"
#include "amqptap/track.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Receives the plaintext stream of every connection (for the pcapng
 * capture) with secrets overwritten in place by TAP_REDACT_FILL (same
 * lengths; see redact.h). Client bytes inside an unfinished method frame
 * are held back until the frame is complete, so a secret split across reads
 * is still covered; everything else is passed on in the call that saw it.
 * Client bytes the tap did not decode are never passed on as they are: a
 * method frame that does not decode is overwritten whole when it is on
 * channel 0 or comes before the login finished, every byte after a
 * client-side decode error is overwritten, and so is a frame left unfinished
 * when the connection ends. */
struct tap_capture_sink {
	void *ctx;
	void *(*open)(void *ctx, uint64_t conn, const char *client, const char *server, int64_t ts_us);
	void (*data)(void *ctx, void *sc, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts_us);
	void (*close)(void *ctx, void *sc, const char *how, int64_t ts_us); /* how: as tap_conn_end's reason_by */
	void (*server)(void *ctx, void *sc, const char *server); /* the server moved before any data (NULL: never) */
};

/* Receives the frame trace (--frames): one JSON object per decoded frame, without its newline; the slice is only
 * read during the call. */
struct tap_frames_sink {
	void *ctx;
	void (*line)(void *ctx, const char *json, size_t len);
};

/* Shared by every connection of one tap process (or one replay). */
struct tap_observer {
	struct tap_track *track;
	tap_track_emit_fn emit; /* for decode_error records (the tracker's sink) */
	void *emit_ctx;
	const struct tap_frames_sink *frames; /* NULL: no frame trace */
	uint32_t body_bytes;    /* body prefix length in the frame trace */
	struct tap_buf scratch; /* one record being built */
	const struct tap_capture_sink *capture; /* NULL: no capture */
	uint64_t decode_errors;           /* decode_error records written */
	uint64_t capture_gaps, gap_bytes; /* capture_gap records written, and the bytes they name missing */
	/* the stores of contents in progress (their strings), every channel of every connection: at most about
	 * pending_max (TAP_OBSERVER_PENDING_MAX); contents that found it full and kept no details */
	size_t pending_mem, pending_max;
	uint64_t pending_over;
};

/* Bounds what the decoder keeps of contents in progress across all connections (see conn_store_put in conn_chan.c). */
#define TAP_OBSERVER_PENDING_MAX (64u << 20)

void tap_observer_init(struct tap_observer *o, struct tap_track *track, tap_track_emit_fn emit, void *emit_ctx,
		       const struct tap_frames_sink *frames, uint32_t body_bytes);
void tap_observer_deinit(struct tap_observer *o);

struct tap_conn;

/* Returns NULL when out of memory (the bytes still flow; they are just not
 * decoded). Addresses are copied. */
struct tap_conn *tap_conn_new(struct tap_observer *o, uint64_t id, const char *client, const char *upstream,
			      int64_t now_us);
/* Bytes forwarded at now_us, in order, for one direction. The slice is only
 * read during the call. */
void tap_conn_feed(struct tap_conn *c, enum tap_dir dir, const uint8_t *data, size_t len, int64_t now_us);
/* Why the connection failed below AMQP (unreachable broker, TLS error),
 * for the connection record; call before tap_conn_end. */
void tap_conn_note(struct tap_conn *c, const char *detail);
/* The broker's address changed before any byte passed (the proxy went on to the name's next address): the records
 * and the capture name the new one. */
void tap_conn_upstream(struct tap_conn *c, const char *addr);
/* The proxy's own address towards the broker (tap_track_conn_upstream_local). */
void tap_conn_upstream_local(struct tap_conn *c, const char *addr);
/* The proxy stopped (held) or went on reading the broker's side (tap_track_conn_held). */
void tap_conn_held(struct tap_conn *c, enum tap_track_hold hold, int64_t now_us);
/* --fault: tap_track_fault_mark and tap_track_fault for the connection's tracker. */
void tap_conn_fault_mark(struct tap_conn *c, uint16_t ch, uint64_t seq, enum tap_fault_saw saw, uint32_t rule);
void tap_conn_fault(struct tap_conn *c, const struct tap_fault_act *a, int64_t now_us);
/* The capture lost `missing` bytes of one direction (replay, sniff) from stream `offset` on (the bytes of the
 * direction seen before the hole, delivered or lost): writes a capture_gap record and ends every outstanding publish {"by":"capture_gap"} (a publish whose content the
 * gap cut still gets its record). The broker side stops decoding: an answer after the hole could belong to a
 * publish already ended, and every later publish ends so as it completes. The client side restarts its decoder in
 * frame state: the caller feeds it again from a frame boundary; every later publish ends as it completes, with
 * "seq": null since publishes in the hole shifted the count. The capture copy gets no client bytes after it. */
void tap_conn_gap(struct tap_conn *c, enum tap_dir dir, uint64_t offset, uint64_t missing, int64_t now_us);
/* The capture began after the connection did (replay, sniff): the channels' confirm and tx modes were not seen
 * (tap_track_conn_unseen). */
void tap_conn_start_unseen(struct tap_conn *c, int64_t now_us);
/* The TCP connection is gone: every outstanding publish is written with
 * {"by": reason_by} unless a close method said more; frees c. */
void tap_conn_end(struct tap_conn *c, const char *reason_by, int64_t now_us);

#endif
