/* What the tap asks of the file system outside its outputs and captures (io). */
#ifndef AMQPTAP_FILES_H
#define AMQPTAP_FILES_H

#include <stdbool.h>

/* Whether a and b both exist and are one file (the same device and inode): a tap_conf_same_inode_fn. */
bool tap_files_same_inode(const char *a, const char *b);

#endif
