/* TCP reassembly for the capture reader (capture.h): segments in, per-direction ordered byte streams out through
 * the tap_capture_cb callbacks. Internal to src/core. */
#ifndef AMQPTAP_REASM_H
#define AMQPTAP_REASM_H

#include "amqptap/capture.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One TCP segment as parsed from a packet; slices point into the packet. */
struct tap_segment {
	bool v6;
	uint8_t src[16], dst[16];
	uint16_t sport, dport;
	uint32_t seq, ack;
	uint8_t flags;
	const uint8_t *payload;
	size_t len;
	/* payload bytes after those captured that the capture's snap length cut off: the segment covers len + lost
	 * bytes of sequence space, and the lost ones are a gap */
	size_t lost;
};

struct stream;
struct half;

/* A list of streams through one of their links (the link's offset in struct stream), oldest first. */
struct stream_list {
	struct stream *head, *tail;
	size_t n;
	size_t link;
};

struct tap_reasm {
	uint16_t ports[TAP_CAPTURE_MAX_PORTS]; /* the broker's; ports[0] is set by the caller */
	size_t n_ports;
	const struct tap_capture_cb *cb; /* never NULL; its members may be */
	struct tap_capture_stats *st;    /* the capture's: tcp_packets, streams, bytes, ... are counted here */
	struct stream **tab;
	size_t tab_size, n_streams;
	struct stream_list open;       /* creation order */
	struct stream_list live, dead; /* open streams by activity; closed ones kept for their late packets */
	struct stream_list quiet;      /* open streams not opened for the caller yet: no byte or gap so far */
	int64_t idle_us;
	size_t max_streams;
	size_t ooo_held; /* out-of-order segments buffered in every stream: bytes and bookkeeping (ooo_cost) */
	/* the latest capture time seen: streams age by it, not by each packet's own time, so packets of a clock that
	 * runs behind (a merge of two hosts' captures, a clock stepped back) do not make the others look idle */
	int64_t now;
	bool now_set;
	/* the clock moved on by the idle time or more at one packet (jump_at): a silence of every stream, or two
	 * clocks apart (captures of two hosts merged); the next packet tells which (see tap_reasm_expire) */
	bool jump_pending;
	int64_t jump_at;
	uint64_t jump_step;
	/* stream directions awaiting bytes their peer acknowledged, oldest wait first (tap_reasm_expire_acks) */
	struct half *wait_head, *wait_tail;
};

/* Empty, counting into st; port, cb, idle_us and max_streams are set by the caller before the first segment. */
void tap_reasm_init(struct tap_reasm *r, struct tap_capture_stats *st);
/* Closes the streams silent for idle_us at capture time ts (TAP_CAPTURE_END_IDLE) and forgets the closed ones;
 * the clock never goes back: a ts behind the latest one seen expires at that one. */
void tap_reasm_expire(struct tap_reasm *r, int64_t ts);
/* A packet's time, before its segment: tap_reasm_expire at it, unless it moved the clock on by the idle time or
 * more at once, which the packet after it resolves (a silence of every stream, or two clocks apart). */
void tap_reasm_packet_time(struct tap_reasm *r, int64_t ts);
/* Bytes a peer acknowledged that the capture has not had for TAP_CAPTURE_REORDER_US by capture time now are
 * given up on (gap callbacks); tap_reasm_expire does this at every packet. */
void tap_reasm_expire_acks(struct tap_reasm *r, int64_t now);
/* See tap_capture_known_until. */
int64_t tap_reasm_known_until(const struct tap_reasm *r);
/* One segment seen at ts: 0, or TAP_E_NOMEM. */
int tap_reasm_segment(struct tap_reasm *r, const struct tap_segment *g, int64_t ts);
/* The end of the capture: every open stream is closed (after a FIN as that FIN's end, else _END_CAPTURE). */
void tap_reasm_close_all(struct tap_reasm *r, int64_t ts);
/* Frees every stream without calling back. */
void tap_reasm_deinit(struct tap_reasm *r);

#endif
