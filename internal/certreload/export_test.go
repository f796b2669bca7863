package certreload

import "time"

// SetPoll sets how often r's Start polls the files; call it before Start.
func SetPoll(r *Reloader, d time.Duration) { r.poll = d }
