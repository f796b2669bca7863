package certreload

import "time"

// SetPoll sets how often r's Start polls the files; call it before Start.
func SetPoll(r *Reloader, d time.Duration) { r.poll = d }

// SetSettle sets how long r's Start waits after the last event before it
// reads the files; call it before Start.
func SetSettle(r *Reloader, d time.Duration) { r.settle = d }
