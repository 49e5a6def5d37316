/* The writer's file (see out_int.h): opening the path and opening it again (SIGHUP, a deleted file, a FIFO whose
 * reader went away), waiting for a FIFO's reader without blocking, and cutting a cut record off a regular file. */
#include "out_int.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

/* Opens o's path for writing without waiting (a FIFO nobody reads refuses: ENXIO); the descriptor writes
 * blocking. */
static int open_path(const struct tap_out *o, enum open_how how)
{
	static const int create[] = {[OPEN_EXISTING] = 0, [OPEN_NEW] = O_CREAT | O_EXCL, [OPEN_ANY] = O_CREAT};
	int fd = open(o->path, out_open_flags(o->private_mode) | create[how], 0600);
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

OUT_OF_LINE bool out_is_fifo(int fd)
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

/* open_path, tried again every READER_RETRY_MS while the path is a FIFO nobody reads (and, with OPEN_EXISTING,
 * while it is missing: a reader may make it again), as long as it takes; -1 with errno set when it failed
 * otherwise. OPEN_ANY: a missing file is made, and o->made says whether this call made it (O_EXCL first: a file
 * someone else made in the meantime is not taken for the tap's own). The wait is where a close may cancel the
 * writer. */
static int open_waiting(struct tap_out *o, enum open_how how)
{
	bool create = how != OPEN_EXISTING;
	o->made = false;
	for (;;) {
		int fd = create ? open_path(o, OPEN_NEW) : -1;
		if (fd >= 0) {
			o->made = true;
			return fd;
		}
		if (create && errno != EEXIST && errno != EINTR)
			return -1;
		fd = open_path(o, OPEN_EXISTING);
		int err = errno;
		if (fd < 0 && create && err == ENOENT) { /* a link to nothing (or gone since): made as open(2) makes it */
			fd = open_path(o, OPEN_ANY);
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

bool out_waits_for_reader(const struct tap_out *o)
{
	return o->kind == TAP_OUT_LINES && o->path && o->own_fd && o->pipe;
}

/* What is not written yet stays where it is, the rest of data from *off on and the backlog behind it (which the
 * loop keeps bounded, counting what does not fit), until a reader opens the FIFO again; then writing goes on there.
 * The old descriptor is closed only then, so the pipe, with what the last reader left unread in it and the start of
 * a line it stopped in the middle of, lives on for the next reader: the stream stays whole across readers. A FIFO
 * made anew is another pipe: the line being written starts again from its beginning (data starts at a line's), and
 * what was unread in the old one is gone (logged). */
int out_reader_wait(struct tap_out *o, const char *data, size_t *off)
{
	out_report(TAP_OUT_REPORT_ERROR,
		   "--%s %s: the reader went away; records wait for the next one (at most %zu KiB, then they are "
		   "dropped and counted)",
		   o->name, o->path, o->backlog_bytes / 1024);
	int fd = open_waiting(o, OPEN_EXISTING);
	if (fd < 0) {
		int err = errno;
		out_report(TAP_OUT_REPORT_ERROR, "--%s %s: cannot open it again: %s", o->name, o->path, strerror(err));
		return err;
	}
	if (!same_file(fd, o->fd)) {
		const char *nl = *off ? memrchr(data, '\n', *off) : NULL;
		*off = nl ? (size_t)(nl - data) + 1 : 0;
		size_t unread = pipe_unread(o->fd);
		if (unread)
			out_report(TAP_OUT_REPORT_ERROR,
				   "--%s %s: made anew while unread: the %zu bytes of records the last reader left "
				   "in the old FIFO are lost",
				   o->name, o->path, unread);
	}
	close(o->fd);
	o->fd = fd;
	o->pipe = out_is_fifo(fd);
	out_report(TAP_OUT_REPORT_INFO, "--%s %s: a reader opened it; writing again", o->name, o->path);
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

OUT_OF_LINE bool out_open_again(struct tap_out *o, enum open_how how)
{
	int fd = open_waiting(o, how);
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
	o->pipe = out_is_fifo(fd);
	o->partial = false; /* a cut line stays in the old file, the new one starts clean */
	o->broken = false;
	o->head_due = o->file_head.len > 0; /* in an existing pcapng file, a new section: read as one capture */
	return true;
}

OUT_OF_LINE void out_open_first(struct tap_out *o)
{
	if (!out_open_again(o, OPEN_EXISTING)) /* the writes that find no descriptor count the records lost */
		out_report(TAP_OUT_REPORT_ERROR, "--%s %s: cannot open: %s", o->name, o->path, strerror(errno));
}

OUT_OF_LINE bool out_file_deleted(const struct tap_out *o)
{
	struct stat st;
	return o->path && o->own_fd && o->fd >= 0 && fstat(o->fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 0;
}

bool out_remove_cut(struct tap_out *o, size_t cut)
{
	struct stat st;
	if (fstat(o->fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < cut)
		return false;
	return ftruncate(o->fd, st.st_size - (off_t)cut) == 0;
}
