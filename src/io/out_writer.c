/* The writer thread of an output (see out_int.h): takes the chunks off the backlog the loop fills, writes them with
 * plain blocking write()s, and after a failed write counts what it lost, repairs the cut and marks the gap. */
#include "out_int.h"

#include "amqptap/thread.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

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
		if (n < 0 && err == EPIPE && out_waits_for_reader(o)) {
			err = out_reader_wait(o, data, off);
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
		lost = out_count_newlines(d + off, c->data.len - off);
		if (lost > c->records) /* a loss note chunk holds no record */
			lost = c->records;
		const char *nl = off ? memrchr(d, '\n', off) : NULL;
		cut = nl ? off - (size_t)(nl - d) - 1 : off;
	}
	out_writer_lost(o, lost, err);
	if (cut == 0 || out_remove_cut(o, cut))
		return;
	if (o->kind != TAP_OUT_BLOCKS) {
		o->partial = true;
		return;
	}
	o->broken = true;
	out_report(TAP_OUT_REPORT_ERROR,
		   "--%s %s: a block was cut and cannot be removed; nothing more is written to it", o->name,
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
		out_loss_note(&o->note, o, o->wlost_unreported, o->wfirst_us, TAP_OUT_LOST_WRITE_FAILED, o->werr);
		o->note_off = 0;
		if (write_all(o, o->note.data, o->note.len, &o->note_off)) {
			if (o->note_off > 0 && !out_remove_cut(o, o->note_off))
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
	if (o->head_off > 0 && !out_remove_cut(o, o->head_off)) {
		o->broken = true;
		out_report(TAP_OUT_REPORT_ERROR,
			   "--%s %s: its head blocks were cut and cannot be removed; nothing more is written to it",
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

static void writer_reopen(struct tap_out *o)
{
	if (!o->path || !o->own_fd)
		return;
	if (out_open_again(o, OPEN_ANY)) {
		(void)writer_head(o); /* at once, so the new file reads before any block; a failure: with the next */
		return;
	}
	int err = errno;
	out_report(TAP_OUT_REPORT_ERROR, "--%s %s: cannot reopen: %s; %s", o->name, o->path, strerror(err),
		   out_file_deleted(o) ? "the old file was deleted: records are counted lost until the path can be "
					 "opened (tried at every batch)"
				       : "still writing to the old file");
}

static void writer_chunk(struct tap_out *o, struct chunk *c)
{
	if (c->records == 0 && c->data.len == 0)
		return;
	if (out_file_deleted(o) && !out_open_again(o, OPEN_ANY)) { /* deleted, and the path cannot be made again yet */
		out_writer_lost(o, c->records, errno);
		return;
	}
	if (o->broken) {
		out_writer_lost(o, c->records, EIO);
		return;
	}
	if (!writer_recover(o)) {
		out_writer_lost(o, c->records, o->werr ? o->werr : EIO);
		return;
	}
	int err = writer_head(o);
	if (err) { /* blocks without it could not be read: lost too, and the head is tried again with the next */
		out_writer_lost(o, c->records, err);
		return;
	}
	o->current_off = 0;
	while (!err && o->current_off < c->data.len)
		err = write_all(o, c->data.data, piece_end(o, c, o->current_off), &o->current_off);
	if (err)
		chunk_failed(o, c, o->current_off, err);
}

/* Under mu: a while for the next batch, coming back by itself (enqueue wakes it only when the backlog grows). */
static void writer_doze(struct tap_out *o)
{
	o->writer_state = WRITER_DOZING;
	struct timespec until = tap_mono_abs(tap_out_clock_us() + WRITER_DOZE_US);
	while (!o->head && !o->closing && o->writer_state == WRITER_DOZING)
		if (pthread_cond_timedwait(&o->wake, &o->mu, &until) == ETIMEDOUT)
			break;
}

/* Under mu: until there is something to write or the output closes; a doze first, then sleep (enum writer_state).
 * The log never dozes: its few lines are each wanted on the terminal at once. */
static void writer_wait(struct tap_out *o)
{
	if (o->head || o->closing)
		return;
	if (o->kind != TAP_OUT_TEXT)
		writer_doze(o);
	o->writer_state = WRITER_ASLEEP;
	while (!o->head && !o->closing)
		pthread_cond_wait(&o->wake, &o->mu);
	o->writer_state = WRITER_BUSY;
}

void *out_writer_main(void *arg)
{
	struct tap_out *o = arg;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	if (o->fd < 0)
		out_open_first(o);
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
		out_chunk_recycle(o, c);
		pthread_cond_broadcast(&o->room);
	}
	o->writer_done = true;
	pthread_cond_broadcast(&o->room);
	pthread_mutex_unlock(&o->mu);
	return NULL;
}
