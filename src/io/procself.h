/* The process as /proc/self shows it (io layer, for admin.c). */
#ifndef AMQPTAP_PROCSELF_H
#define AMQPTAP_PROCSELF_H

#include "amqptap/metrics.h"

/* When the process started, in Unix seconds; 0: not known. */
double tap_procself_start_time(void);
/* Fills s's process fields (have_process, CPU, memory, descriptors) from /proc/self; start_time_seconds as
 * tap_procself_start_time gave it. Leaves them unset when /proc cannot be read. */
void tap_procself_snapshot(struct tap_metrics_snapshot *s, double start_time_seconds);

#endif
