/* What the tap asks of the file system outside its outputs and captures (io). */
#ifndef AMQPTAP_FILES_H
#define AMQPTAP_FILES_H

#include <stdbool.h>
#include <stddef.h>

/* Whether a and b both exist and are one file (the same device and inode): a tap_conf_same_inode_fn. */
bool tap_files_same_inode(const char *a, const char *b);

/* Reads the whole of path (a file or a FIFO) into a malloc'd buffer, *len bytes plus a NUL; more than max bytes is
 * refused. Returns 0, or -1 with one line in err (the path and why). The --definitions file and route's cases. */
int tap_files_read(const char *path, size_t max, char **out, size_t *len, char *err, size_t err_cap);

#endif
