#!/bin/sh
# Runs the command "$@" pinned to one CPU: the first this process may use (taskset, util-linux).
cpu=$(taskset -cp $$ | sed 's/.*: //; s/[-,].*//') || exit 1
exec taskset -c "$cpu" "$@"
