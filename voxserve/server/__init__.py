"""Transports, and the session driver they share: each wire supplies its way in, its
send/close and its codec; wire parsing stays free of I/O."""
