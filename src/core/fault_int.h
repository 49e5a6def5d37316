/* The fault rewriter's own declarations, private to the core (include/amqptap/fault.h is its interface):
 *
 *   fault_rw.c      the per-connection rewriter: frames cut from each direction, confirms rewritten, bytes held
 *   fault_select.c  which rule selects a publish or a connection, and each rule's counters per connection
 *   fault_chan.c    close-channel: the channel closed on both sides, the peers' close-oks swallowed
 *   fault_return.c  return, return-after-ack: the publish's content kept, a Basic.Return made of it
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
	uint8_t skip;       /* return: enum fault_skip, why it is not shown after all */
	uint32_t returns_at; /* return: the channel's count of the broker's Returns when it was published */
	uint8_t *content;   /* return: basic.return and the publish's content frames, ready to send (NULL: none) */
	uint32_t content_len;
};

/* Why a return rule that selected a publish shows the client nothing else after all (its fault record says). */
enum fault_skip {
	FSKIP_NONE,
	FSKIP_TOO_LARGE,       /* content over TAP_FAULT_RETURN_CONTENT_MAX, or past TAP_FAULT_RETURN_HELD_MAX kept */
	FSKIP_NO_MEMORY,
	FSKIP_BROKER_RETURNED, /* the broker returned a publish of the channel between it and its ack itself */
	FSKIP_BROKER_NACKED,   /* the broker nacked it: a Return would say it was routed */
	FSKIP_INCOMPLETE,      /* its content never ended (the next publish came first: the broker closes) */
};

/* close-channel: where a channel closed by a rule is (struct fchan.fclose bits) */
enum {
	FC_CLIENT = 1 << 0,   /* the client's close-ok is to come: its frames on the channel are dropped */
	FC_BROKER = 1 << 1,   /* the broker's close-ok is to come: its frames on the channel are dropped once shown */
	FC_SHOW = 1 << 2,     /* channel.close to the client at the broker stream's next frame boundary */
	FC_SHOWN = 1 << 3,
	FC_ANSWER_CLIENT = 1 << 4, /* channel.close-ok to the client's own close (the closes crossed) */
	FC_ANSWER_BROKER = 1 << 5, /* channel.close-ok to the broker's own close, at the client stream's next boundary */
	FC_CLOSE_WAIT = 1 << 6,    /* the tap's channel.close to the broker waits for its confirm of the publish */
	FC_CLOSE_DUE = 1 << 7,     /* ... which came: the close goes at the client stream's next boundary */
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
	/* return: the selected publish's content as it passes (ret: basic.return first) */
	bool pub_return;
	uint8_t ret_skip;
	uint8_t *ret;
	uint32_t ret_len, ret_cap;
	uint32_t returns; /* basic.return frames the broker sent on the channel */
	/* close-channel */
	bool pub_close;
	uint8_t fclose;    /* FC_ bits; 0: not closed by a rule */
	uint16_t close_code;
	uint32_t close_rule;
	uint64_t close_seq;
	char *close_text;  /* what the client is shown ("" for the code's own) */
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
	bool drop;       /* the frame's bytes are not passed on (close-channel) */
	bool capture;    /* the client's content frame is kept for a Return */
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
	/* close-channel */
	uint32_t n_fclosed;   /* channels with fclose bits: none, no per-frame look */
	uint32_t n_show;      /* with FC_SHOW or FC_ANSWER_CLIENT */
	uint32_t n_answer;    /* with FC_ANSWER_BROKER */
	bool waiting;         /* the client's bytes wait in c2s_wait for a broker's close-ok */
	bool release_wait;
	uint8_t *c2s_wait;
	size_t c2s_wait_len;
	/* return */
	uint32_t n_capturing; /* channels with a publish's content being kept */
	size_t ret_held;      /* bytes kept for Returns */
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

static inline void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static inline void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)(v >> 16));
	put16(p + 2, (uint16_t)v);
}

static inline void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)(v >> 32));
	put32(p + 4, (uint32_t)v);
}

static inline uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static inline uint32_t get32(const uint8_t *p)
{
	return (uint32_t)get16(p) << 16 | get16(p + 2);
}

static inline uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) << 32 | get32(p + 4);
}

/* fault_rw.c: bytes for the peer of dir (broker to client: after what is held); a rule acted; the client is shown
 * saw for a publish; the channel's state (NULL when unknown); it forgets the channel. */
void fault_out(struct tap_fault_conn *fc, enum tap_dir dir, const uint8_t *p, size_t len);
void fault_act(struct tap_fault_conn *fc, const struct tap_fault_act *a);
void fault_mark(struct tap_fault_conn *fc, uint16_t ch, uint64_t seq, enum tap_fault_saw saw, uint32_t rule);
struct fchan *fault_chan_find(struct tap_fault_conn *fc, uint16_t id);
void fault_chan_drop(struct tap_fault_conn *fc, uint16_t id);
/* Keeps len bytes at the end of *buf (what the client sends while it is not read); false without memory. */
bool fault_keep(uint8_t **buf, size_t *buf_len, const uint8_t *data, size_t len);

/* fault_chan.c (close-channel) */
/* The selected publish's content ended: channel.close to the broker now, to the client at the next boundary. */
void fault_close_start(struct tap_fault_conn *fc, struct fchan *c);
/* The client's method frame on a channel a rule closed (not passed on); p_frame: the whole frame. */
void fault_close_client_method(struct tap_fault_conn *fc, struct fchan *c, uint16_t cls, uint16_t m,
			       const uint8_t *frame, size_t frame_len);
/* The broker's method frame on such a channel (frame: the whole frame, 7 + size + 1 bytes): true when it is not
 * passed on. */
bool fault_close_broker_method(struct tap_fault_conn *fc, struct fchan *c, uint16_t cls, uint16_t m,
			       const uint8_t *frame, uint32_t size);
/* Whether a frame on channel ch is not passed on (dir: where it came from); client frames on a channel whose close
 * the broker has not answered start the wait (true is returned, fc->waiting set). */
bool fault_close_drops(struct tap_fault_conn *fc, enum tap_dir dir, uint16_t ch);
/* At a frame boundary of the broker's stream: channel.close (and close-ok) frames the client is owed. */
void fault_close_show(struct tap_fault_conn *fc);
/* At a frame boundary of the client's stream: the channel.close and close-ok frames the broker is owed. */
void fault_close_answer(struct tap_fault_conn *fc);
/* A channel's close state forgotten (it is dropped). */
void fault_close_forget(struct tap_fault_conn *fc, struct fchan *c);

/* fault_return.c (return, return-after-ack) */
/* A publish selected by rule r: its basic.return made now (exchange and routing key), its content kept as it
 * passes. */
void fault_return_select(struct tap_fault_conn *fc, struct fchan *c, const struct tap_fault_rule *r,
			 const uint8_t *ex, size_t ex_len, const uint8_t *rk, size_t rk_len);
/* A content frame's header of channel c (7 bytes): whether its bytes are kept (p->capture). */
void fault_return_frame(struct tap_fault_conn *fc, struct fchan *c, struct fparse *p);
void fault_return_bytes(struct tap_fault_conn *fc, uint16_t ch, const uint8_t *data, size_t len);
/* The publish's content is complete: what was kept goes to its tag (or is dropped). */
void fault_return_done(struct tap_fault_conn *fc, struct fchan *c, bool complete);
/* The broker acked (nack: nacked) tags [first, last) of c: Returns before the confirm (phase 0) or after it (1). */
void fault_return_emit(struct tap_fault_conn *fc, struct fchan *c, uint32_t first, uint32_t last, bool nack,
		       int phase);
void fault_tag_free(struct tap_fault_conn *fc, struct ftag *t);
void fault_return_forget(struct tap_fault_conn *fc, struct fchan *c);

/* The counters of rule `id` on this connection (a slot of a rule removed since is taken again); NULL when all are
 * in use. */
struct ctr *fault_counter(struct tap_fault_conn *fc, uint32_t id);
/* The first rule in force that selects this publish (index into fc->set->rules), or -1; counts it for the rules. */
int fault_select_rule(struct tap_fault_conn *fc, const struct fchan *c, const uint8_t *ex, size_t ex_len,
		      const uint8_t *rk, size_t rk_len, bool mandatory);
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
