/* Capture files for the core's reader (capture.h): a regular file, a FIFO, a pipe or standard input, the last three
 * read as their bytes arrive (tcpdump -U -w -). io: the core parses, this reads. */
#ifndef AMQPTAP_CAPFILE_H
#define AMQPTAP_CAPFILE_H

#include "amqptap/capture.h"

#include <stdbool.h>
#include <stddef.h>

/* How often a reader whose pipe waits for its next record hears so (tap_capture_cb.idle). */
#define TAP_CAPFILE_IDLE_EVERY_MS 100

/* Opens a capture file and reads its header; path "-" is standard input. A pipe or device is read as its bytes
 * arrive, the idle callback telling when the next read may wait. Returns 0 or a negative status (TAP_E_IO,
 * TAP_E_BAD_CAPTURE, TAP_E_NOMEM) with a message in err; the capture is freed with tap_capture_free. */
int tap_capfile_open(struct tap_capture **c, const char *path, char *err, size_t cap);
/* The same for a reader a signal may stop while the file is opened (a FIFO waits for its writer) or its header is
 * awaited (a writer that has not written yet): a signal's interruption asks stop(ctx) (it may also do what the
 * signal asked), and once that says to stop, the capture is one without packets, and no error. */
int tap_capfile_open_until(struct tap_capture **c, const char *path, bool (*stop)(void *ctx), void *ctx, char *err,
			   size_t cap);

#endif
