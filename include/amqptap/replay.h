/* Offline replay (src/DESIGN.md §6): a recorded capture is reassembled into TCP streams and run through the same
 * per-connection observers and verdict tracker as live traffic, with the capture's timestamps as the clock, so
 * the records (and their latencies) are deterministic. */
#ifndef AMQPTAP_REPLAY_H
#define AMQPTAP_REPLAY_H

#include "amqptap/capture.h"
#include "amqptap/conn.h"
#include "amqptap/track.h"

#include <stddef.h>
#include <stdint.h>

/* Per TCP stream of server port `port`: one tap_conn (id = stream number from 1), fed both directions with the
 * capture's timestamps; stream close -> tap_conn_end with "client_eof", "broker_eof", "client_reset", "broker_reset",
 * "capture_idle" for a stream that carried nothing for TAP_CAPTURE_IDLE_US_DEFAULT, "capture_limit" for the least
 * recently active one when more than TAP_CAPTURE_MAX_STREAMS_DEFAULT are open (a later packet of either starts a new
 * mid-stream connection), or "capture_end" for streams open at the end. tap_track_tick runs at a packet when a deadline
 * may be due (only up to what tap_capture_known_until says while bytes a peer acknowledged are awaited, at most
 * TAP_CAPTURE_REORDER_US), and tap_track_tick + tap_track_shutdown at the last timestamp. A stream seen without its SYN is
 * resynchronised on the first plausible frame boundary of each direction. Returns 0 or a negative status with a message
 * in err; on a corrupt capture everything before the fault has been replayed and written. */
struct tap_replay_stats {
	uint64_t gaps;      /* holes in a stream direction: one capture_gap record each */
	uint64_t gap_bytes; /* the bytes they lost */
	struct tap_capture_stats capture; /* what the capture held (not for tap_replay_live_end) */
};
/* Reading a pipe, idle is called when the next read may wait: records batched by the caller should go out.
 * ports: more broker ports besides `port`. min_window_us: the shorter of the tracker's return window and
 * late-return hold; tap_track_tick then runs only when one of its deadlines may be due instead of at every
 * packet (0: at every packet). */
struct tap_replay_hooks {
	void *ctx;
	void (*idle)(void *ctx); /* a pipe waits for packets: at once and every 100 ms while it does */
	/* The wall clock (Unix us), or NULL. With it, a pipe whose packets are read within TAP_REPLAY_LIVE_US of their
	 * timestamps is a live capture: while it waits, its clock goes on, TAP_REPLAY_LIVE_LAG_US behind, or more when
	 * packets came later than that (then as late as the latest, plus TAP_REPLAY_LIVE_SLACK_US). */
	int64_t (*clock)(void *ctx);
	bool (*stop)(void *ctx); /* as tap_capture_cb's; may be NULL */
	const uint16_t *ports;
	size_t n_ports;
	int64_t min_window_us;
};
#define TAP_REPLAY_LIVE_US (10 * 1000000LL)
/* tcpdump -U without --immediate-mode hands a packet over up to its 1 s buffer timeout after capturing it: a clock
 * that went on closer to the wall clock would be ahead of packets still to come, which could not go back for them
 * (their latencies came out 0, a window ran out before the answer that closed it was read). */
#define TAP_REPLAY_LIVE_LAG_US (1200 * 1000LL)
#define TAP_REPLAY_LIVE_SLACK_US (200 * 1000LL)

/* Replays c, a capture opened and not yet run (tap_capture_open_mem, or from a file or a pipe as it arrives:
 * tap_capfile_open_until, so that records follow a live `tcpdump -U -w -`); c stays the caller's. hooks and stats
 * may be NULL; stats is written whatever the outcome. */
int tap_replay_capture(struct tap_capture *c, uint16_t port, struct tap_observer *obs, struct tap_track *track,
		       const struct tap_replay_hooks *hooks, struct tap_replay_stats *stats, char *err, size_t cap);
/* The same over a capture in memory, opened here (stats zero when it could not be); name is used in messages. */
int tap_replay_run_mem(const void *data, size_t len, const char *name, uint16_t port, struct tap_observer *obs,
		       struct tap_track *track, struct tap_replay_stats *stats, char *err, size_t cap);

/* Packets pushed as they are captured (`amqptap sniff` on libpcap): the same streams, observers, gaps and
 * records as a replay, the packets' timestamps as the clock. */
struct tap_replay_live;
/* ports: the broker ports (1 to TAP_CAPTURE_MAX_PORTS, else TAP_E_USAGE); min_window_us as in tap_replay_hooks. */
int tap_replay_live_new(struct tap_replay_live **l, const uint16_t *ports, size_t n_ports, int64_t min_window_us,
			struct tap_observer *obs, struct tap_track *track);
/* One packet of link type `linktype` (TAP_CAPTURE_LINK_*), caplen bytes of wire_len (as tap_capture_push); 0 or
 * TAP_E_NOMEM. */
int tap_replay_live_packet(struct tap_replay_live *l, uint32_t linktype, int64_t ts_us, const uint8_t *packet,
			   size_t caplen, size_t wire_len);
/* The capture's clock reached now_us with no packet (a quiet capture): what the tracker holds until a time (a plain
 * publish's late-Return window, a mandatory one's --return-window) is settled once that time has passed, as a packet
 * at now_us would settle it. The clock never goes back; before the first packet nothing happens. */
void tap_replay_live_advance(struct tap_replay_live *l, int64_t now_us);
/* Ends every open stream ("capture_end"), settles the tracker at now_us (or the last packet's time if later),
 * fills stats (may be NULL; zero for a NULL l) and frees l. */
void tap_replay_live_end(struct tap_replay_live *l, int64_t now_us, struct tap_replay_stats *stats);

#endif
