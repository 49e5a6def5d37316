/* Output files written by one thread each, so the forwarding loop never waits on a write. See
 * include/amqptap/out.h for the model; this file holds the backlog, the writer thread and the loss accounting. */
#include "amqptap/out.h"

#include "amqptap/buf.h"
#include "amqptap/json.h"
#include "amqptap/log.h"
#include "amqptap/record.h"
#include "amqptap/thread.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SPARE_CHUNKS 4
#define SPARE_MAX_BYTES (256 * 1024) /* a batch grown past this by one big record is freed, not kept */
#define FILL_SLACK (4 * 1024)        /* a new batch's room past TAP_OUT_BATCH_BYTES */
#define CANCEL_JOIN_MS 200
#define READER_RETRY_MS 200 /* how often a FIFO nobody reads is tried again */
#define TEXT_RESERVE_BYTES (8 * 1024) /* TEXT: room kept for lines that find no memory (the summary at exit) */
#define LOSS_NOTE_BYTES 512           /* room for a loss note (it may still grow the batch) */
#define WRITER_DOZE_US (50 * 1000)    /* how long the writer waits for more before it sleeps (see enqueue) */

/* Where the writer is, for enqueue: waking it costs the loop thread a futex call and, on a busy machine, a context
 * switch that makes the loop forward fewer messages per read; a writer that has just written is dozing and comes back
 * by itself, so only a sleeping one is woken (or a dozing one whose backlog has grown past a quarter). */
enum writer_state {
	WRITER_BUSY,   /* writing, or about to look at the queue */
	WRITER_DOZING, /* waiting WRITER_DOZE_US for the next batch, woken only when the backlog grows */
	WRITER_ASLEEP, /* the queue stayed empty through a doze: waiting until something comes */
};

/* Whether the output closes its descriptor: stdout and stderr stay open. */
enum fd_owner {
	FD_BORROWED,
	FD_OWNED,
};

enum chunk_kind {
	CHUNK_DATA,
	CHUNK_REOPEN,
};

/* A batch of whole records, as handed from the loop to the writer. */
struct chunk {
	struct chunk *next;
	enum chunk_kind kind;
	struct tap_buf data;
	uint64_t records;
	size_t *ends; /* BLOCKS: where each record ends, to find the record a failed write cut */
	size_t ends_cap;
	bool reserve; /* the TEXT output's reserve: goes back to it once written */
};

struct tap_out {
	char *name;
	char *path; /* NULL: a descriptor the caller owns */
	enum tap_out_kind kind;
	size_t backlog_bytes;
	int fd;
	bool own_fd;
	bool pipe; /* a pipe or FIFO: written in whole records of at most PIPE_BUF bytes where it can be */
	bool private_mode; /* tap_out_conf's */
	struct tap_buf file_head; /* tap_out_conf's head (BLOCKS) */
	char *run, *tap_id;  /* tap_out_conf's (LINES), NULL: none */

	/* loop thread (TEXT: under mu) */
	struct chunk *fill;
	int64_t wait_until_us;
	uint64_t records;
	/* records lost, by cause: BACKLOG_FULL and NO_MEMORY (dropped before reaching the backlog) by this thread,
	 * WRITE_FAILED by the writer and UNFLUSHED by close, both under mu */
	uint64_t lost_by[TAP_OUT_N_LOSSES];
	uint64_t drop_unreported;   /* dropped since the last records_lost record */
	int64_t drop_first_us;
	bool drop_no_memory;        /* some of those for want of memory, not of room in the backlog */
	bool drop_reported[TAP_OUT_N_LOSSES]; /* the log heard of the first drop, by cause */

	pthread_mutex_t mu;
	pthread_cond_t wake; /* writer: something queued, or closing */
	pthread_cond_t room; /* loop: a chunk was written, or the writer ended */
	struct chunk *head, *tail;
	size_t queued_bytes; /* including the chunk being written */
	struct chunk *spare;
	size_t n_spare;
	struct chunk *reserve; /* TEXT: a batch allocated at open for when memory runs out; NULL while in use */
	bool closing;
	bool writer_done;
	enum writer_state writer_state;
	uint64_t write_errors;
	pthread_t thread;

	/* writer thread only (read by close after join) */
	struct chunk *current;
	size_t current_off;
	bool partial;  /* a line was cut and could not be removed: the next write starts with "\n" */
	bool broken;   /* a block was cut and could not be removed: nothing more can be appended */
	bool head_due; /* the file does not begin with the head yet */
	bool made;     /* the last open_waiting made the file */
	size_t head_off;
	bool fail_reported;
	uint64_t wlost_unreported;
	int64_t wfirst_us;
	int werr;
	struct tap_buf note;
	size_t note_off;      /* how much of the note (or a cut line's end) is written */
	struct pollfd wait;   /* what write_all polls: kept off the stack (see OUT_OF_LINE) */
};

int64_t tap_out_clock_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t wall_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- chunks ---- */

static struct chunk *chunk_new(void)
{
	struct chunk *c = calloc(1, sizeof *c);
	if (c)
		tap_buf_init(&c->data);
	return c;
}

static void chunk_free(struct chunk *c)
{
	if (!c)
		return;
	tap_buf_deinit(&c->data);
	free(c->ends);
	free(c);
}

static void chunk_reset(struct chunk *c)
{
	tap_buf_reset(&c->data);
	c->records = 0;
	c->kind = CHUNK_DATA;
	c->next = NULL;
}

/* Under mu. */
static void chunk_recycle(struct tap_out *o, struct chunk *c)
{
	if (c->reserve) {
		chunk_reset(c);
		o->reserve = c;
		return;
	}
	if (o->n_spare >= SPARE_CHUNKS || c->data.cap > SPARE_MAX_BYTES) {
		chunk_free(c);
		return;
	}
	chunk_reset(c);
	c->next = o->spare;
	o->spare = c;
	o->n_spare++;
}

/* Under mu. */
static struct chunk *chunk_take(struct tap_out *o)
{
	struct chunk *c = o->spare;
	if (!c)
		return chunk_new();
	o->spare = c->next;
	o->n_spare--;
	c->next = NULL;
	return c;
}

/* Under mu: a batch holding len bytes, taking the reserve if memory is short and it is free; NULL if neither. */
static struct chunk *chunk_with_room(struct tap_out *o, size_t len)
{
	struct chunk *c = chunk_take(o);
	if (c && tap_buf_reserve(&c->data, len))
		return c;
	if (c)
		chunk_recycle(o, c);
	c = o->reserve;
	if (!c || len > c->data.cap)
		return NULL;
	o->reserve = NULL;
	return c;
}

/* Under mu: a new batch to fill, allocated at the size it is handed over at (plus room for the record that takes
 * it past), not doubled up to it; a recycled one keeps its capacity. */
static struct chunk *fill_take(struct tap_out *o)
{
	struct chunk *c = chunk_take(o);
	if (c)
		tap_buf_presize(&c->data, TAP_OUT_BATCH_BYTES + FILL_SLACK);
	return c;
}

/* Under mu: the writer looks at the queue now, whatever it was doing. For whoever waits on it (room, close). */
static void writer_hurry(struct tap_out *o)
{
	o->writer_state = WRITER_BUSY;
	pthread_cond_signal(&o->wake);
}

/* Under mu. */
static void enqueue(struct tap_out *o, struct chunk *c)
{
	c->next = NULL;
	if (o->tail)
		o->tail->next = c;
	else
		o->head = c;
	o->tail = c;
	o->queued_bytes += c->data.len;
	if (o->writer_state == WRITER_ASLEEP ||
	    (o->writer_state == WRITER_DOZING && o->queued_bytes >= o->backlog_bytes / 4))
		writer_hurry(o);
}

static uint64_t count_newlines(const char *p, size_t len)
{
	uint64_t n = 0;
	const char *end = p + len;
	while (p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
		n++;
		p++;
	}
	return n;
}

/* ---- the loss notes: a records_lost record (LINES) or a line of text (TEXT) ---- */

/* err: the write's errno (write_failed), else 0 and no_memory says which cause of a drop. */
static void loss_note(struct tap_buf *b, const struct tap_out *o, uint64_t lost, int64_t first_us, int err,
		      bool no_memory)
{
	tap_buf_reset(b);
	if (o->kind == TAP_OUT_TEXT) {
		tap_buf_printf(b, "amqptap: %" PRIu64 " line(s) of this log were lost (%s)\n", lost,
			       err ? strerror(err) : no_memory ? "no memory" : "written faster than it was read");
		return;
	}
	struct tap_json j;
	tap_record_begin_once(&j, b, "records_lost", wall_us(), o->run); /* run: whose loss, in merged records */
	if (o->tap_id)
		tap_json_kv_str(&j, "tap", o->tap_id);
	tap_json_kv_str(&j, "output", o->name);
	tap_json_kv_uint(&j, "lost", lost);
	tap_json_kv_ts(&j, "first_lost_ts", first_us);
	tap_json_kv_str(&j, "reason", tap_out_loss_name(err         ? TAP_OUT_LOST_WRITE_FAILED
							  : no_memory ? TAP_OUT_LOST_NO_MEMORY
								      : TAP_OUT_LOST_BACKLOG_FULL));
	if (err)
		tap_json_kv_str(&j, "error", strerror(err));
	tap_json_obj_end(&j);
	tap_buf_putc(b, '\n');
}

/* ---- writer thread ---- */

static int reader_wait(struct tap_out *o, const char *data, size_t *off);

/* LINES into a FIFO the tap opened by its path: a reader that went away (EPIPE) is waited for, not written off (a
 * log shipper restarting). */
static bool waits_for_reader(const struct tap_out *o)
{
	return o->kind == TAP_OUT_LINES && o->path && o->own_fd && o->pipe;
}

/* Writes len bytes from *off on, waiting as long as the file takes; this is where a writer can be cancelled.
 * Returns 0, or the errno that stopped it with *off at the first byte not written. (No local of this frame, or
 * of the frames below it, has its address taken: see OUT_OF_LINE.) */
static int write_all(struct tap_out *o, const char *data, size_t len, size_t *off)
{
	while (*off < len) {
		pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
		ssize_t n = write(o->fd, data + *off, len - *off);
		int err = errno;
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
		if (n > 0) {
			*off += (size_t)n;
			continue;
		}
		if (n < 0 && err == EINTR)
			continue;
		if (n < 0 && err == EPIPE && waits_for_reader(o)) {
			err = reader_wait(o, data, off);
			if (!err)
				continue;
			return err;
		}
		if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) { /* an inherited O_NONBLOCK descriptor */
			o->wait = (struct pollfd){.fd = o->fd, .events = POLLOUT};
			pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
			(void)poll(&o->wait, 1, -1); /* whatever it says, the next write tells */
			pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
			continue;
		}
		return n < 0 ? err : EIO;
	}
	return 0;
}

static void writer_lost(struct tap_out *o, uint64_t lost, int err)
{
	pthread_mutex_lock(&o->mu);
	o->lost_by[TAP_OUT_LOST_WRITE_FAILED] += lost;
	o->write_errors++;
	pthread_mutex_unlock(&o->mu);
	if (o->wlost_unreported == 0)
		o->wfirst_us = wall_us();
	o->wlost_unreported += lost;
	o->werr = err;
	if (!o->fail_reported && o->kind != TAP_OUT_TEXT) {
		o->fail_reported = true;
		tap_log_error("--%s %s: write failed: %s; records are dropped and counted until writing works again",
			      o->name, o->path ? o->path : "-", strerror(err));
	}
}

/* Removes the first cut bytes at the end of a regular file, the start of a record a failed write cut. */
static bool remove_cut(struct tap_out *o, size_t cut)
{
	struct stat st;
	if (fstat(o->fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < cut)
		return false;
	return ftruncate(o->fd, st.st_size - (off_t)cut) == 0;
}

/* A write of c stopped at off with err: counts the records from the one it cut on, and repairs the cut. */
static void chunk_failed(struct tap_out *o, const struct chunk *c, size_t off, int err)
{
	const char *d = c->data.data;
	uint64_t lost;
	size_t cut;
	if (o->kind == TAP_OUT_BLOCKS) {
		size_t i = 0;
		while (i < c->records && c->ends[i] <= off)
			i++;
		lost = c->records - i;
		cut = off - (i > 0 ? c->ends[i - 1] : 0);
	} else {
		lost = count_newlines(d + off, c->data.len - off);
		if (lost > c->records) /* a loss note chunk holds no record */
			lost = c->records;
		const char *nl = off ? memrchr(d, '\n', off) : NULL;
		cut = nl ? off - (size_t)(nl - d) - 1 : off;
	}
	writer_lost(o, lost, err);
	if (cut == 0 || remove_cut(o, cut))
		return;
	if (o->kind != TAP_OUT_BLOCKS) {
		o->partial = true;
		return;
	}
	o->broken = true;
	tap_log_error("--%s %s: a block was cut and cannot be removed; nothing more is written to it", o->name,
		      o->path ? o->path : "-");
}

/* What must precede new records after a failure: the end of a cut line, then the loss note. False when that
 * could not be written either (the caller's records are then lost too). */
static bool writer_recover(struct tap_out *o)
{
	if (o->partial) {
		o->note_off = 0;
		if (write_all(o, "\n", 1, &o->note_off))
			return false;
		o->partial = false;
	}
	if (o->wlost_unreported == 0)
		return true;
	if (o->kind != TAP_OUT_BLOCKS) {
		loss_note(&o->note, o, o->wlost_unreported, o->wfirst_us, o->werr, false);
		o->note_off = 0;
		if (write_all(o, o->note.data, o->note.len, &o->note_off)) {
			if (o->note_off > 0 && !remove_cut(o, o->note_off))
				o->partial = true;
			return false;
		}
	}
	o->wlost_unreported = 0;
	return true;
}

/* BLOCKS: the head, when the file does not begin with it yet. Returns 0, or the errno that stopped it (the part it
 * wrote is removed; where it cannot be, nothing more is written, as after a cut block). */
static int writer_head(struct tap_out *o)
{
	if (!o->head_due)
		return 0;
	o->head_off = 0;
	int err = write_all(o, o->file_head.data, o->file_head.len, &o->head_off);
	if (!err) {
		o->head_due = false;
		return 0;
	}
	if (o->head_off > 0 && !remove_cut(o, o->head_off)) {
		o->broken = true;
		tap_log_error("--%s %s: its head blocks were cut and cannot be removed; nothing more is written to it",
			      o->name, o->path ? o->path : "-");
	}
	return err;
}

/* Where the next write of c from off should end. A pipe takes a write of up to PIPE_BUF bytes whole or not at all,
 * so a writer cancelled while a stalled reader holds it never leaves half a record there: pipes get whole records
 * in pieces of at most PIPE_BUF (a longer record alone). Anything else gets the rest of the chunk at once. */
static size_t piece_end(const struct tap_out *o, const struct chunk *c, size_t off)
{
	size_t len = c->data.len;
	if (!o->pipe || len - off <= PIPE_BUF)
		return len;
	if (o->kind == TAP_OUT_BLOCKS) {
		size_t end = off;
		for (size_t i = 0; i < c->records; i++) {
			if (c->ends[i] <= off)
				continue;
			if (c->ends[i] - off > PIPE_BUF)
				return end > off ? end : c->ends[i];
			end = c->ends[i];
		}
		return end > off ? end : len;
	}
	const char *d = c->data.data;
	const char *nl = memrchr(d + off, '\n', PIPE_BUF);
	if (nl)
		return (size_t)(nl - d) + 1;
	nl = memchr(d + off + PIPE_BUF, '\n', len - off - PIPE_BUF);
	return nl ? (size_t)(nl - d) + 1 : len;
}

/* How open_path treats a missing file. */
enum open_how {
	OPEN_EXISTING, /* ENOENT */
	OPEN_NEW,      /* made (0600), and only a file this call makes: else EEXIST */
	OPEN_ANY,      /* made if missing (also a symbolic link's missing target, which OPEN_NEW refuses) */
};

/* Opens path for writing without waiting (a FIFO nobody reads refuses: ENXIO); the descriptor writes blocking. */
static int open_path(const char *path, enum open_how how)
{
	static const int create[] = {[OPEN_EXISTING] = 0, [OPEN_NEW] = O_CREAT | O_EXCL, [OPEN_ANY] = O_CREAT};
	int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | create[how], 0600);
	if (fd < 0)
		return -1;
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
		int err = errno;
		close(fd);
		errno = err;
		return -1;
	}
	return fd;
}

/* The writer thread can be cancelled (tap_out_close) while it waits in write(), poll() or open(). A cancelled
 * thread's frames are not left the normal way, so under AddressSanitizer the redzones of their address-taken
 * locals stay poisoned, and the thread's own exit then trips over them. So the frames a cancellation can find hold
 * no such local: the cancel state is set without asking for the old one (NULL, which glibc allows), what
 * write_all writes from and polls lives in struct tap_out, and the helpers that need one (fstat) run to their end
 * out of line. */
#define OUT_OF_LINE __attribute__((noinline))

static OUT_OF_LINE bool is_fifo(int fd)
{
	struct stat st;
	return fd >= 0 && fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

/* Whether two descriptors are the same file (for FIFOs: the same pipe, while one of them holds it open). */
static OUT_OF_LINE bool same_file(int a, int b)
{
	struct stat sa, sb;
	return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* Bytes in a pipe that no reader has taken yet; 0 if unknown. */
static OUT_OF_LINE size_t pipe_unread(int fd)
{
	int n = 0;
	return ioctl(fd, FIONREAD, &n) == 0 && n > 0 ? (size_t)n : 0;
}

/* open_path, tried again every READER_RETRY_MS while the path is a FIFO nobody reads (and, without create, while
 * it is missing: a reader may make it again), as long as it takes; -1 with errno set when it failed otherwise.
 * create: a missing file is made, and o->made says whether this call made it (O_EXCL: a file someone else made
 * in the meantime is not taken for the tap's own). The wait is where a close may cancel the writer. */
static int open_waiting(struct tap_out *o, bool create)
{
	const char *path = o->path;
	o->made = false;
	for (;;) {
		int fd = create ? open_path(path, OPEN_NEW) : -1;
		if (fd >= 0) {
			o->made = true;
			return fd;
		}
		if (create && errno != EEXIST && errno != EINTR)
			return -1;
		fd = open_path(path, OPEN_EXISTING);
		int err = errno;
		if (fd < 0 && create && err == ENOENT) { /* a link to nothing (or gone since): made as open(2) makes it */
			fd = open_path(path, OPEN_ANY);
			err = errno;
			o->made = fd >= 0;
		}
		if (fd >= 0 || (err != ENXIO && err != EINTR && (create || err != ENOENT))) {
			errno = err;
			return fd;
		}
		pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
		(void)poll(NULL, 0, READER_RETRY_MS);
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	}
}

/* Writer thread, after EPIPE (waits_for_reader): what is not written yet stays where it is, the rest of data from
 * *off on and the backlog behind it (which the loop keeps bounded, counting what does not fit), until a reader
 * opens the FIFO again; then writing goes on there. The old descriptor is closed only then, so the pipe, with what
 * the last reader left unread in it and the start of a line it stopped in the middle of, lives on for the next
 * reader: the stream stays whole across readers. A FIFO made anew is another pipe: the line being written starts
 * again from its beginning (data starts at a line's), and what was unread in the old one is gone (logged). Returns
 * 0, or the errno of an open that failed otherwise than for want of a reader. */
static int reader_wait(struct tap_out *o, const char *data, size_t *off)
{
	tap_log_error("--%s %s: the reader went away; records wait for the next one (at most %zu KiB, then they are "
		      "dropped and counted)",
		      o->name, o->path, o->backlog_bytes / 1024);
	int fd = open_waiting(o, false);
	if (fd < 0) {
		int err = errno;
		tap_log_error("--%s %s: cannot open it again: %s", o->name, o->path, strerror(err));
		return err;
	}
	if (!same_file(fd, o->fd)) {
		const char *nl = *off ? memrchr(data, '\n', *off) : NULL;
		*off = nl ? (size_t)(nl - data) + 1 : 0;
		size_t unread = pipe_unread(o->fd);
		if (unread)
			tap_log_error("--%s %s: made anew while unread: the %zu bytes of records the last reader left in the "
				      "old FIFO are lost",
				      o->name, o->path, unread);
	}
	close(o->fd);
	o->fd = fd;
	o->pipe = is_fifo(fd);
	tap_log_info("--%s %s: a reader opened it; writing again", o->name, o->path);
	return 0;
}

/* A file made anew at a reopen (after logrotate renamed the old one) gets the old one's mode and group, so a
 * `chmod 640` and `chgrp adm` for a log shipper survive rotations as they survive restarts. Not for a private
 * output (always 0600), and nothing from a FIFO or device. */
static OUT_OF_LINE void keep_mode(const struct tap_out *o, int old_fd, int new_fd)
{
	struct stat was, now;
	if (o->private_mode || old_fd < 0 || fstat(old_fd, &was) != 0 || fstat(new_fd, &now) != 0 ||
	    !S_ISREG(was.st_mode) || !S_ISREG(now.st_mode))
		return;
	if (now.st_gid != was.st_gid) {
		int refused = fchown(new_fd, (uid_t)-1, was.st_gid); /* not ours to give: the mode still applies */
		(void)refused;
	}
	(void)fchmod(new_fd, was.st_mode & 0777);
}

/* Opens the path again and writes to it from now on; false (errno set) when it cannot be opened. A FIFO without a
 * reader is waited for (open_waiting), where a close may cancel the writer. create: see open_waiting. */
static OUT_OF_LINE bool writer_open_again(struct tap_out *o, bool create)
{
	int fd = open_waiting(o, create);
	if (fd < 0)
		return false;
	if (o->private_mode && fchmod(fd, 0600) != 0) { /* secrets: never into a file others read */
		int err = errno;
		close(fd);
		errno = err;
		return false;
	}
	if (o->made)
		keep_mode(o, o->fd, fd);
	if (o->fd >= 0)
		close(o->fd);
	o->fd = fd;
	o->pipe = is_fifo(fd);
	o->partial = false; /* a cut line stays in the old file, the new one starts clean */
	o->broken = false;
	o->head_due = o->file_head.len > 0; /* in an existing pcapng file, a new section: read as one capture */
	return true;
}

/* Writer thread: the open tap_out_open left to it (a FIFO without a reader), waiting for a reader as long as it
 * takes. */
static OUT_OF_LINE void writer_open(struct tap_out *o)
{
	if (!writer_open_again(o, false)) /* the writes that find no descriptor count the records lost */
		tap_log_error("--%s %s: cannot open: %s", o->name, o->path, strerror(errno));
}

/* Whether the file written to was deleted (no name left: what is written to it is lost to every reader). */
static OUT_OF_LINE bool file_deleted(const struct tap_out *o)
{
	struct stat st;
	return o->path && o->own_fd && o->fd >= 0 && fstat(o->fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 0;
}

static void writer_reopen(struct tap_out *o)
{
	if (!o->path || !o->own_fd)
		return;
	if (writer_open_again(o, true)) {
		(void)writer_head(o); /* at once, so the new file reads before any block; a failure: with the next */
		return;
	}
	int err = errno;
	tap_log_error("--%s %s: cannot reopen: %s; %s", o->name, o->path, strerror(err),
		      file_deleted(o) ? "the old file was deleted: records are counted lost until the path can be "
					"opened (tried at every batch)"
				      : "still writing to the old file");
}

static void writer_chunk(struct tap_out *o, struct chunk *c)
{
	if (c->records == 0 && c->data.len == 0)
		return;
	if (file_deleted(o) && !writer_open_again(o, true)) { /* deleted, and the path cannot be made again yet */
		writer_lost(o, c->records, errno);
		return;
	}
	if (o->broken) {
		writer_lost(o, c->records, EIO);
		return;
	}
	if (!writer_recover(o)) {
		writer_lost(o, c->records, o->werr ? o->werr : EIO);
		return;
	}
	int err = writer_head(o);
	if (err) { /* blocks without it could not be read: lost too, and the head is tried again with the next */
		writer_lost(o, c->records, err);
		return;
	}
	o->current_off = 0;
	while (!err && o->current_off < c->data.len)
		err = write_all(o, c->data.data, piece_end(o, c, o->current_off), &o->current_off);
	if (err)
		chunk_failed(o, c, o->current_off, err);
}

/* Under mu: until there is something to write or the output closes; a doze first, then sleep (enum writer_state). */
static void writer_wait(struct tap_out *o)
{
	if (o->head || o->closing)
		return;
	o->writer_state = WRITER_DOZING;
	struct timespec until = tap_mono_abs(tap_out_clock_us() + WRITER_DOZE_US);
	while (!o->head && !o->closing && o->writer_state == WRITER_DOZING)
		if (pthread_cond_timedwait(&o->wake, &o->mu, &until) == ETIMEDOUT)
			break;
	o->writer_state = WRITER_ASLEEP;
	while (!o->head && !o->closing)
		pthread_cond_wait(&o->wake, &o->mu);
	o->writer_state = WRITER_BUSY;
}

static void *writer_main(void *arg)
{
	struct tap_out *o = arg;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	if (o->fd < 0)
		writer_open(o);
	if (o->fd >= 0) /* a tap that never writes a block leaves a valid empty capture; a failure: with the first */
		(void)writer_head(o);
	pthread_mutex_lock(&o->mu);
	for (;;) {
		writer_wait(o);
		struct chunk *c = o->head;
		if (!c)
			break;
		o->head = c->next;
		if (!o->head)
			o->tail = NULL;
		o->current = c;
		pthread_mutex_unlock(&o->mu);
		if (c->kind == CHUNK_REOPEN)
			writer_reopen(o);
		else
			writer_chunk(o, c);
		pthread_mutex_lock(&o->mu);
		o->current = NULL;
		o->queued_bytes -= c->data.len;
		chunk_recycle(o, c);
		pthread_cond_broadcast(&o->room);
	}
	o->writer_done = true;
	pthread_cond_broadcast(&o->room);
	pthread_mutex_unlock(&o->mu);
	return NULL;
}

/* ---- open and close ---- */

static void out_free(struct tap_out *o)
{
	struct chunk *c = o->head;
	while (c) {
		struct chunk *next = c->next;
		chunk_free(c);
		c = next;
	}
	c = o->spare;
	while (c) {
		struct chunk *next = c->next;
		chunk_free(c);
		c = next;
	}
	chunk_free(o->fill);
	chunk_free(o->reserve);
	chunk_free(o->current);
	tap_buf_deinit(&o->note);
	tap_buf_deinit(&o->file_head);
	pthread_cond_destroy(&o->wake);
	pthread_cond_destroy(&o->room);
	pthread_mutex_destroy(&o->mu);
	free(o->name);
	free(o->path);
	free(o->run);
	free(o->tap_id);
	free(o);
}

/* glibc loads the unwinder pthread_cancel needs (libgcc_s) at the first cancel, and aborts the process when that
 * load finds no memory ("libgcc_s.so.1 must be installed for pthread_cancel to work"): a stuck writer cancelled at
 * a stop while memory was short took the summary and the exit status with it. backtrace() loads the same unwinder
 * and, should that fail, just returns 0: called at the first open, while memory is whole, it loads it for good. */
static void load_unwinder(void)
{
	void *pc;
	(void)backtrace(&pc, 1);
}

static struct tap_out *out_new(const struct tap_out_conf *conf, int fd, enum fd_owner owner)
{
	static pthread_once_t unwinder = PTHREAD_ONCE_INIT;
	pthread_once(&unwinder, load_unwinder);
	struct tap_out *o = calloc(1, sizeof *o);
	if (!o)
		return NULL;
	o->name = strdup(conf->name ? conf->name : "output");
	o->path = conf->path && strcmp(conf->path, "-") != 0 ? strdup(conf->path) : NULL;
	o->kind = conf->kind;
	o->backlog_bytes = conf->backlog_bytes ? conf->backlog_bytes : TAP_OUT_BACKLOG_DEFAULT;
	o->fd = fd;
	o->own_fd = owner == FD_OWNED;
	o->private_mode = conf->private_mode;
	o->pipe = is_fifo(fd);
	o->fill = conf->kind == TAP_OUT_TEXT ? chunk_new() : fill_take(o); /* nobody else sees o yet: no lock */
	if (conf->kind == TAP_OUT_TEXT && (o->reserve = chunk_new()) != NULL) {
		o->reserve->reserve = true;
		tap_buf_presize(&o->reserve->data, TEXT_RESERVE_BYTES);
	}
	bool reserved = conf->kind != TAP_OUT_TEXT || (o->reserve && o->reserve->data.cap >= TEXT_RESERVE_BYTES);
	tap_buf_init(&o->note);
	tap_buf_init(&o->file_head);
	if (conf->kind == TAP_OUT_BLOCKS && conf->head_len)
		tap_buf_append(&o->file_head, conf->head, conf->head_len);
	o->head_due = o->file_head.len > 0;
	o->run = conf->run ? strdup(conf->run) : NULL;
	o->tap_id = conf->tap_id ? strdup(conf->tap_id) : NULL;
	pthread_mutex_init(&o->mu, NULL);
	tap_cond_init_mono(&o->wake);
	tap_cond_init_mono(&o->room);
	bool copied = !o->file_head.oom && (!conf->run || o->run) && (!conf->tap_id || o->tap_id);
	if (!o->name || (conf->path && strcmp(conf->path, "-") != 0 && !o->path) || !o->fill || !reserved || !copied) {
		out_free(o);
		errno = ENOMEM;
		return NULL;
	}
	char thread_name[32];
	snprintf(thread_name, sizeof thread_name, "out:%s", o->name);
	int rc = tap_thread_start(&o->thread, writer_main, o, thread_name);
	if (rc != 0) {
		out_free(o);
		errno = rc;
		return NULL;
	}
	return o;
}

struct tap_out *tap_out_open(const struct tap_out_conf *conf)
{
	if (!conf->path || strcmp(conf->path, "-") == 0)
		return out_new(conf, STDOUT_FILENO, FD_BORROWED);
	/* never waiting here: a FIFO without a reader refuses a non-blocking open (ENXIO), and the writer waits */
	int fd = open(conf->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0600);
	if (fd < 0 && errno == ENXIO) {
		tap_log_info("--%s %s: a FIFO nobody reads yet: records wait for a reader in the backlog", conf->name,
			     conf->path);
		return out_new(conf, -1, FD_OWNED);
	}
	if (fd < 0)
		return NULL;
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0 || (conf->private_mode && fchmod(fd, 0600) < 0)) {
		int saved = errno;
		close(fd);
		errno = saved;
		return NULL;
	}
	struct tap_out *o = out_new(conf, fd, FD_OWNED);
	if (!o) {
		int saved = errno;
		close(fd);
		errno = saved;
	}
	return o;
}

struct tap_out *tap_out_open_fd(const struct tap_out_conf *conf, int fd)
{
	return out_new(conf, fd, FD_BORROWED);
}

/* ---- the loop side ---- */

static void note_drop(struct tap_out *o, uint64_t records, enum tap_out_loss cause)
{
	if (records == 0)
		return;
	o->lost_by[cause] += records;
	if (o->drop_unreported == 0) {
		o->drop_first_us = wall_us();
		o->drop_no_memory = false;
	}
	o->drop_unreported += records;
	o->drop_no_memory |= cause == TAP_OUT_LOST_NO_MEMORY;
	if (o->drop_reported[cause] || o->kind == TAP_OUT_TEXT)
		return;
	o->drop_reported[cause] = true;
	if (cause == TAP_OUT_LOST_NO_MEMORY)
		tap_log_error("--%s %s: no memory for records; they are dropped and counted", o->name,
			      o->path ? o->path : "-");
	else
		tap_log_error("--%s %s: written slower than records come (%zu KiB backlog full); records are dropped "
			      "and counted",
			      o->name, o->path ? o->path : "-", o->backlog_bytes / 1024);
}

/* Under mu: whether len more bytes fit, after waiting for room as long as allowed. */
static bool room_for(struct tap_out *o, size_t len)
{
	for (;;) {
		if (o->queued_bytes == 0 || o->queued_bytes + len <= o->backlog_bytes)
			return true;
		if (o->writer_done || o->wait_until_us <= 0)
			return false;
		writer_hurry(o);
		if (o->wait_until_us == INT64_MAX) {
			pthread_cond_wait(&o->room, &o->mu);
			continue;
		}
		if (tap_out_clock_us() >= o->wait_until_us)
			return false;
		struct timespec ts = tap_mono_abs(o->wait_until_us);
		pthread_cond_timedwait(&o->room, &o->mu, &ts);
	}
}

/* Under mu: waits for the writer to finish a chunk (the reserve may be back), until deadline_us; false, without
 * waiting, once the deadline has passed or the writer has ended. */
static bool written_until(struct tap_out *o, int64_t deadline_us)
{
	if (o->writer_done || tap_out_clock_us() >= deadline_us)
		return false;
	writer_hurry(o);
	struct timespec until = tap_mono_abs(deadline_us);
	pthread_cond_timedwait(&o->room, &o->mu, &until);
	return true;
}

/* Under mu: a loss note before the next records, in its own chunk, if losses are unreported and it fits. Returns
 * whether none is left unreported. */
static bool queue_drop_note(struct tap_out *o)
{
	if (o->drop_unreported == 0 || o->kind == TAP_OUT_BLOCKS)
		return true;
	struct chunk *n = chunk_with_room(o, LOSS_NOTE_BYTES);
	if (!n)
		return false;
	loss_note(&n->data, o, o->drop_unreported, o->drop_first_us, 0, o->drop_no_memory);
	if (n->data.oom || !room_for(o, n->data.len)) {
		chunk_recycle(o, n);
		return false;
	}
	enqueue(o, n);
	o->drop_unreported = 0;
	return true;
}

/* Under mu: hands the fill batch over (or drops it whole) and starts a new one. */
static void hand_over(struct tap_out *o)
{
	struct chunk *c = o->fill;
	if (!c) {
		o->fill = fill_take(o);
		return;
	}
	if (c->records == 0) { /* by records, not bytes: a batch whose first append found no memory holds records */
		queue_drop_note(o);
		return;
	}
	bool no_memory = c->data.oom || (o->kind == TAP_OUT_BLOCKS && c->ends == NULL);
	if (no_memory || !room_for(o, c->data.len)) {
		note_drop(o, c->records, no_memory ? TAP_OUT_LOST_NO_MEMORY : TAP_OUT_LOST_BACKLOG_FULL);
		chunk_reset(c);
		return;
	}
	queue_drop_note(o);
	enqueue(o, c);
	o->fill = fill_take(o);
}

void tap_out_flush(struct tap_out *o)
{
	if (o->kind == TAP_OUT_TEXT)
		return; /* text is handed over as it comes */
	if (o->fill && o->fill->records == 0 && o->drop_unreported == 0)
		return;
	pthread_mutex_lock(&o->mu);
	hand_over(o);
	pthread_mutex_unlock(&o->mu);
}

void tap_out_line(struct tap_out *o, const char *data, size_t len)
{
	struct chunk *c = o->fill;
	o->records++;
	if (!c) { /* no memory for a batch */
		note_drop(o, 1, TAP_OUT_LOST_NO_MEMORY);
		tap_out_flush(o);
		return;
	}
	tap_buf_append(&c->data, data, len);
	tap_buf_putc(&c->data, '\n');
	c->records++;
	if (c->data.len >= TAP_OUT_BATCH_BYTES || c->data.oom)
		tap_out_flush(o);
}

void tap_out_block(struct tap_out *o, const void *data, size_t len)
{
	struct chunk *c = o->fill;
	o->records++;
	if (!c) {
		note_drop(o, 1, TAP_OUT_LOST_NO_MEMORY);
		tap_out_flush(o);
		return;
	}
	if (c->records == c->ends_cap) {
		size_t cap = c->ends_cap ? c->ends_cap * 2 : 256;
		size_t *ends = realloc(c->ends, cap * sizeof *ends);
		if (!ends) {
			c->data.oom = true; /* the batch is dropped whole at the flush */
		} else {
			c->ends = ends;
			c->ends_cap = cap;
		}
	}
	tap_buf_append(&c->data, data, len);
	if (!c->data.oom)
		c->ends[c->records] = c->data.len;
	c->records++;
	if (c->data.len >= TAP_OUT_BATCH_BYTES || c->data.oom)
		tap_out_flush(o);
}

bool tap_out_text(struct tap_out *o, const char *data, size_t len)
{
	return tap_out_text_until(o, data, len, 0);
}

bool tap_out_text_until(struct tap_out *o, const char *data, size_t len, int64_t deadline_us)
{
	pthread_mutex_lock(&o->mu);
	o->records++;
	uint64_t lines = count_newlines(data, len);
	struct chunk *c = chunk_with_room(o, len);
	while (!c && !o->reserve && written_until(o, deadline_us)) /* the reserve is out */
		c = chunk_with_room(o, len);
	bool taken = c && room_for(o, len);
	while (c && !taken && written_until(o, deadline_us)) /* the backlog is full */
		taken = room_for(o, len);
	if (!taken) {
		note_drop(o, lines ? lines : 1, c ? TAP_OUT_LOST_BACKLOG_FULL : TAP_OUT_LOST_NO_MEMORY);
		if (c)
			chunk_recycle(o, c);
	} else {
		tap_buf_append(&c->data, data, len);
		c->records = lines;
		(void)queue_drop_note(o);
		enqueue(o, c);
	}
	pthread_mutex_unlock(&o->mu);
	return taken;
}

void tap_out_wait_until(struct tap_out *o, int64_t mono_us)
{
	pthread_mutex_lock(&o->mu);
	o->wait_until_us = mono_us;
	pthread_mutex_unlock(&o->mu);
}

void tap_out_reopen(struct tap_out *o)
{
	if (!o->path)
		return;
	pthread_mutex_lock(&o->mu);
	hand_over(o);
	struct chunk *c = chunk_take(o);
	if (c) {
		c->kind = CHUNK_REOPEN;
		enqueue(o, c);
	}
	pthread_mutex_unlock(&o->mu);
	if (!c)
		tap_log_error("--%s %s: cannot reopen: out of memory", o->name, o->path);
}

/* Under mu. */
static void stats_locked(const struct tap_out *o, struct tap_out_stats *st)
{
	st->records = o->records;
	st->lost = 0;
	for (int i = 0; i < TAP_OUT_N_LOSSES; i++) {
		st->lost_by[i] = o->lost_by[i];
		st->lost += o->lost_by[i];
	}
	st->write_errors = o->write_errors;
}

void tap_out_get_stats(struct tap_out *o, struct tap_out_stats *st)
{
	pthread_mutex_lock(&o->mu);
	stats_locked(o, st);
	pthread_mutex_unlock(&o->mu);
}

/* Under mu, with the writer gone or stuck: the records it did not write, counting the chunk it was in from
 * current_off on (0 when the writer could not be joined and its progress is unknown). */
static uint64_t unwritten_records(const struct tap_out *o, size_t current_off)
{
	uint64_t n = 0;
	const struct chunk *c = o->current;
	if (c && c->kind == CHUNK_DATA) {
		if (o->kind == TAP_OUT_BLOCKS) {
			for (size_t i = 0; i < c->records; i++)
				n += c->ends[i] > current_off;
		} else {
			n = count_newlines(c->data.data + current_off, c->data.len - current_off);
			if (n > c->records) /* a loss note chunk holds no record */
				n = c->records;
		}
	}
	for (c = o->head; c; c = c->next)
		n += c->kind == CHUNK_DATA ? c->records : 0;
	return n;
}

/* Under mu: a TEXT output's last line names the lines lost since its last note; with memory short it waits for the
 * reserve to be written, until the deadline. */
static void last_text_note(struct tap_out *o, int64_t deadline_us)
{
	while (!queue_drop_note(o) && written_until(o, deadline_us))
		;
}

/* Writers that could not be cancelled, kept reachable so their memory is not reported as leaked. */
static struct tap_out *abandoned[16];

void tap_out_close(struct tap_out *o, int64_t deadline_us, struct tap_out_stats *st)
{
	struct tap_out_stats last = {0};
	if (!o) {
		if (st)
			*st = last;
		return;
	}
	pthread_mutex_lock(&o->mu);
	if (o->wait_until_us < deadline_us)
		o->wait_until_us = deadline_us;
	if (o->kind != TAP_OUT_TEXT)
		hand_over(o);
	else
		last_text_note(o, deadline_us);
	o->closing = true;
	writer_hurry(o);
	struct timespec until = tap_mono_abs(deadline_us);
	while (!o->writer_done && tap_out_clock_us() < deadline_us)
		pthread_cond_timedwait(&o->room, &o->mu, &until);
	bool done = o->writer_done;
	pthread_mutex_unlock(&o->mu);

	bool joined = done;
	if (done) {
		pthread_join(o->thread, NULL);
	} else {
		pthread_cancel(o->thread);
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += CANCEL_JOIN_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		joined = pthread_timedjoin_np(o->thread, NULL, &ts) == 0;
	}
	pthread_mutex_lock(&o->mu);
	o->lost_by[TAP_OUT_LOST_UNFLUSHED] += unwritten_records(o, joined ? o->current_off : 0);
	stats_locked(o, &last);
	pthread_mutex_unlock(&o->mu);
	if (st)
		*st = last;
	if (!joined) {
		for (size_t i = 0; i < sizeof abandoned / sizeof abandoned[0]; i++) {
			if (!abandoned[i]) {
				abandoned[i] = o;
				break;
			}
		}
		return;
	}
	if (o->own_fd && o->fd >= 0)
		close(o->fd);
	out_free(o);
}
