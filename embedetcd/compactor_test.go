package embedetcd

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCompactorTarget: the age rule compacts to the newest revision at
// least a retention old; the size rule, over a quarter of the quota,
// halves the history kept when that goes further; neither compacts a
// revision already compacted.
func TestCompactorTarget(t *testing.T) {
	t0 := time.Unix(1000, 0)
	marks := []mark{{t0, 110}, {t0.Add(time.Minute), 150}, {t0.Add(3 * time.Minute), 190}}
	for name, tc := range map[string]struct {
		sizeBound bool
		now       time.Time
		inUse     int64
		want      int64
		bySize    bool
	}{
		"nothing old enough":             {true, t0.Add(4 * time.Minute), 10, 0, false},
		"age: the newest old enough":     {true, t0.Add(6 * time.Minute), 10, 150, false},
		"age: all marks old enough":      {true, t0.Add(9 * time.Minute), 10, 190, false},
		"size: half of what is kept":     {true, t0.Add(4 * time.Minute), 26, 150, true},
		"size under a quarter: age only": {true, t0.Add(6 * time.Minute), 25, 150, false},
		"age beyond half: age":           {true, t0.Add(9 * time.Minute), 26, 190, false},
		"size rule off":                  {false, t0.Add(4 * time.Minute), 100, 0, false},
	} {
		t.Run(name, func(t *testing.T) {
			c := &compactor{retention: 5 * time.Minute, quota: 100, sizeBound: tc.sizeBound, marks: marks, compacted: 100}
			got, bySize := c.target(tc.now, 200, tc.inUse)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.bySize, bySize)
		})
	}
}
