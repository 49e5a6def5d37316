/* The fault rewriter's own declarations, private to the core (include/amqptap/fault.h is its interface):
 *
 *   fault_rw.c      the per-connection rewriter: frames cut from each direction, confirms rewritten, bytes held
 *   fault_select.c  which rule selects a publish or a connection, and each rule's counters per connection
 *   fault_shape.c   latency and bandwidth: what the rewriter emits held per direction until due, and paced */
#ifndef AMQPTAP_FAULT_INT_H
#define AMQPTAP_FAULT_INT_H

#include "amqptap/fault.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Method frames up to this payload are kept whole until decided (start-ok with its client properties fits; a
 * larger one is not looked at). */
#define FAULT_SMALL 4096
#define FRAME_METHOD 1
#define FRAME_HEADER 2
#define FRAME_BODY 3
#define FRAME_HEARTBEAT 8
#define FRAME_END 0xCE

struct ftag {
	uint64_t tag;
	uint32_t rule;
	uint32_t ms;
	uint8_t action;
};

struct fchan {
	uint16_t id;
	bool confirm;
	uint64_t next_seq; /* the tag of the next publish in confirm mode */
	uint64_t last_tag; /* the highest tag the broker confirmed */
	uint64_t withheld; /* tags withheld: confirms go one at a time */
	/* the client's publish whose content is arriving */
	bool pub_open, pub_header, pub_kill, pub_block;
	uint64_t body_left, pub_seq;
	uint32_t kill_rule, block_rule, block_s;
	struct ftag *tags; /* ascending */
	uint32_t n_tags, cap_tags;
};

struct fparse {
	uint8_t hdr[7];
	uint8_t n_hdr;
	uint8_t type;
	uint16_t ch;
	uint32_t size;
	uint64_t left;   /* payload bytes and the end octet still to come */
	bool collect;    /* the frame is kept in small */
	uint32_t n_small;
	uint8_t small[7 + FAULT_SMALL + 1];
};

struct hold {
	struct hold *next;
	int64_t due;
	size_t len;
	uint8_t data[];
};

/* Bytes emitted in one direction while latency or bandwidth held that direction: released in order from `off`. */
struct chunk {
	struct chunk *next;
	int64_t due; /* not before (latency; bandwidth alone: when it came) */
	size_t len, off;
	uint8_t data[];
};

/* One direction's latency and bandwidth: the rules acting on it now, and what they hold. */
struct fshape {
	uint32_t lat_rule, bw_rule; /* their ids; 0: none */
	uint32_t ms, jitter_ms;
	uint32_t kib;
	struct tap_fault_pace pace; /* rate 0: no bandwidth rule */
	struct chunk *head, *tail;
	size_t held;
	int64_t last_due; /* the due time given last: never earlier for later bytes (order) */
	int64_t next;     /* when release has something to do; INT64_MAX: nothing held */
};

struct ctr {
	uint32_t id;
	uint64_t seen, acts;
};

struct tap_fault_conn {
	struct tap_fault_set *set;
	uint64_t id;
	char client[80];
	char user[128], vhost[128], name[128];
	struct fchan *chans;
	uint32_t n_chans, cap_chans;
	uint32_t n_tags; /* over all channels: at most TAP_FAULT_TAGS_MAX */
	struct ctr ctr[TAP_FAULT_RULES_MAX];
	struct fparse p[TAP_DIR_COUNT];
	bool header_seen; /* the client's protocol header (8 bytes, not a frame) */
	uint8_t n_proto;
	/* kill */
	bool killing, kill_now;
	uint16_t kill_ch;
	uint64_t kill_tag;
	enum tap_fault_kill_mode kill_mode;
	uint32_t kill_rule;
	/* block */
	bool blocked_cap;  /* the client's capabilities say connection.blocked */
	bool blocking;     /* the client is not read; what it sent after the publish waits in c2s_held */
	bool inject_blocked, inject_unblocked; /* to the client at the broker stream's next frame boundary */
	uint32_t block_ms;
	uint8_t *c2s_held;
	size_t c2s_held_len;
	/* held broker bytes (delay-confirms) */
	struct hold *head, *tail;
	size_t held;
	int64_t floor; /* bytes emitted now are not due before this */
	/* latency, bandwidth (fault_shape.c), indexed by enum tap_dir */
	struct fshape shape[TAP_DIR_COUNT];
	uint64_t jitter_rng;
	int64_t now;
	const struct tap_fault_io *io;
};

/* The counters of rule `id` on this connection (a slot of a rule removed since is taken again); NULL when all are
 * in use. */
struct ctr *fault_counter(struct tap_fault_conn *fc, uint32_t id);
/* The first rule in force that selects this publish (index into fc->set->rules), or -1; counts it for the rules. */
int fault_select_rule(struct tap_fault_conn *fc, const struct fchan *c, const uint8_t *ex, size_t ex_len,
		      const uint8_t *rk, size_t rk_len);
/* The stall-heartbeats rule in force for this connection, or NULL. */
const struct tap_fault_rule *fault_stall_rule(struct tap_fault_conn *fc);
/* The first rule of action a (latency, bandwidth) in force for this connection acting on direction dir, or NULL. */
const struct tap_fault_rule *fault_way_rule(struct tap_fault_conn *fc, enum tap_fault_action a, enum tap_dir dir);

/* fault_shape.c. Takes the latency and bandwidth rules now in force for the connection (a `fault` record when one
 * begins acting on it); at every feed and release. */
void fault_shape_select(struct tap_fault_conn *fc);
/* Passes bytes on to dir's peer (io->emit), or holds them behind what latency or bandwidth holds there. */
void fault_emit(struct tap_fault_conn *fc, enum tap_dir dir, const uint8_t *p, size_t len);
/* Emits what is due by fc->now and the rate allows (broker bytes of a connection being killed are dropped). */
void fault_shape_release(struct tap_fault_conn *fc);
/* When fault_shape_release next has something to do; INT64_MAX when nothing is held. */
int64_t fault_shape_due(const struct tap_fault_conn *fc);
void fault_shape_free(struct tap_fault_conn *fc);

#endif
