package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The scale benchmarks (scale_bench_test.go) print each curve as a table
// and draw it as an SVG chart under docs/. This file draws the charts and
// the tables, with the standard library only.

// scaleSeries is one line of a chart: Y[i] measured at X[i].
type scaleSeries struct {
	Name string
	X, Y []float64
}

// scaleChart is one curve of a scale benchmark: fencer and its baseline,
// one series each, over a log-scaled x axis.
type scaleChart struct {
	File                  string // the chart is drawn as docs/scale-<File>.svg
	Title, XLabel, YLabel string
	Series                []scaleSeries
}

var errChart = errors.New("scale chart: invalid data")

// Chart geometry, in SVG user units.
const (
	chartW, chartH             = 560.0, 320.0
	chartLeft, chartRight      = 70.0, 150.0 // the right margin holds the legend
	chartTop, chartBottom      = 40.0, 50.0
	chartPlotW, chartPlotH     = chartW - chartLeft - chartRight, chartH - chartTop - chartBottom
	chartYTicks                = 5
	chartFont                  = `font-family="sans-serif" font-size="11"`
	chartColorFencer, chartAlt = "#1f77b4", "#d62728"
)

// svg draws c: a log-scaled x axis with a tick at each measured x, a
// linear y axis from 0, a polyline and one circle per measured value for
// each series, axis labels and a legend. It refuses a series whose X and
// Y differ in length, an x that is not positive, and a y that is negative
// or not finite. It does not guarantee that labels never overlap.
func (c scaleChart) svg() ([]byte, error) {
	xmin, xmax, ymax := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range c.Series {
		if len(s.X) != len(s.Y) || len(s.X) == 0 {
			return nil, fmt.Errorf("%w: series %q has %d x and %d y values", errChart, s.Name, len(s.X), len(s.Y))
		}
		for i := range s.X {
			if !(s.X[i] > 0) || math.IsInf(s.X[i], 0) {
				return nil, fmt.Errorf("%w: series %q: x %v is not positive (the x axis is logarithmic)", errChart, s.Name, s.X[i])
			}
			if !(s.Y[i] >= 0) || math.IsInf(s.Y[i], 0) {
				return nil, fmt.Errorf("%w: series %q: y %v is negative or not finite", errChart, s.Name, s.Y[i])
			}
			xmin, xmax, ymax = math.Min(xmin, s.X[i]), math.Max(xmax, s.X[i]), math.Max(ymax, s.Y[i])
		}
	}
	if len(c.Series) == 0 {
		return nil, fmt.Errorf("%w: no series", errChart)
	}
	if ymax == 0 {
		ymax = 1
	}
	ytop := niceCeil(ymax * 1.05)
	lx0, lx1 := math.Log10(xmin), math.Log10(xmax)
	if lx1 == lx0 {
		lx0, lx1 = lx0-0.5, lx1+0.5
	}
	px := func(x float64) float64 { return chartLeft + (math.Log10(x)-lx0)/(lx1-lx0)*chartPlotW }
	py := func(y float64) float64 { return chartTop + chartPlotH - y/ytop*chartPlotH }
	esc := html.EscapeString

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g">`+"\n", chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<rect width="%g" height="%g" fill="white"/>`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<text x="%g" y="20" %s font-weight="bold">%s</text>`+"\n", chartLeft, chartFont, esc(c.Title))
	// Axes.
	fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/>`+"\n", chartLeft, chartTop+chartPlotH, chartLeft+chartPlotW, chartTop+chartPlotH)
	fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/>`+"\n", chartLeft, chartTop, chartLeft, chartTop+chartPlotH)
	// x ticks at each distinct measured x.
	seen := map[float64]bool{}
	for _, s := range c.Series {
		for _, x := range s.X {
			if seen[x] {
				continue
			}
			seen[x] = true
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="black"/>`+"\n", px(x), chartTop+chartPlotH, px(x), chartTop+chartPlotH+4)
			fmt.Fprintf(&b, `<text x="%.1f" y="%g" %s text-anchor="middle">%s</text>`+"\n", px(x), chartTop+chartPlotH+16, chartFont, esc(fmtNum(x)))
		}
	}
	// y ticks and grid.
	for i := 0; i <= chartYTicks; i++ {
		y := ytop * float64(i) / chartYTicks
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/>`+"\n", chartLeft, py(y), chartLeft+chartPlotW, py(y))
		fmt.Fprintf(&b, `<text x="%g" y="%.1f" %s text-anchor="end">%s</text>`+"\n", chartLeft-6, py(y)+4, chartFont, esc(fmtNum(y)))
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" %s text-anchor="middle">%s (log scale)</text>`+"\n", chartLeft+chartPlotW/2, chartH-10, chartFont, esc(c.XLabel))
	fmt.Fprintf(&b, `<text x="14" y="%g" %s text-anchor="middle" transform="rotate(-90 14 %g)">%s</text>`+"\n", chartTop+chartPlotH/2, chartFont, chartTop+chartPlotH/2, esc(c.YLabel))
	// Series, with a legend entry each.
	for i, s := range c.Series {
		color := chartColorFencer
		if i > 0 {
			color = chartAlt
		}
		var pts []string
		for j := range s.X {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.X[j]), py(s.Y[j])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
		for j := range s.X {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %s at %s</title></circle>`+"\n", px(s.X[j]), py(s.Y[j]), color, esc(s.Name), esc(fmtNum(s.Y[j])), esc(fmtNum(s.X[j])))
		}
		ly := chartTop + 10 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="2"/>`+"\n", chartLeft+chartPlotW+10, ly, chartLeft+chartPlotW+28, ly, color)
		fmt.Fprintf(&b, `<text x="%g" y="%g" %s>%s</text>`+"\n", chartLeft+chartPlotW+32, ly+4, chartFont, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	return b.Bytes(), nil
}

// niceCeil rounds v > 0 up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// fmtNum prints v briefly: 10000 as 10k, 0.25 as 0.25.
func fmtNum(v float64) string {
	switch {
	case v >= 1e6 && math.Mod(v, 1e6) == 0:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3 && math.Mod(v, 1e3) == 0:
		return fmt.Sprintf("%gk", v/1e3)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

// slope is the least-squares slope of y over x: the growth of y per unit
// of x. It is NaN with fewer than two distinct x.
func slope(x, y []float64) float64 {
	n := float64(len(x))
	var sx, sy, sxx, sxy float64
	for i := range x {
		sx, sy, sxx, sxy = sx+x[i], sy+y[i], sxx+x[i]*x[i], sxy+x[i]*y[i]
	}
	d := n*sxx - sx*sx
	if len(x) < 2 || d == 0 {
		return math.NaN()
	}
	return (n*sxy - sx*sy) / d
}

// scaleTable is a Markdown table printed by a scale benchmark.
type scaleTable struct {
	Header []string
	Rows   [][]string
}

func (t scaleTable) write(w io.Writer) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(t.Header, " | "))
	fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(t.Header)))
	for _, r := range t.Rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
}

// TestScaleChart checks that a chart is well-formed XML with one circle
// per measured value, that the slope is the least-squares one, and that
// data a log axis cannot draw is refused.
func TestScaleChart(t *testing.T) {
	c := scaleChart{Title: "RSS <&> sessions", XLabel: "sessions", YLabel: "MB", Series: []scaleSeries{
		{Name: "fencer", X: []float64{1, 100, 1000, 10000}, Y: []float64{30, 31, 40, 120}},
		{Name: "etcd concurrency.Session", X: []float64{1, 100, 1000}, Y: []float64{28, 29, 33}},
	}}
	out, err := c.svg()
	require.NoError(t, err)
	dec := xml.NewDecoder(bytes.NewReader(out))
	circles, root := 0, ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "not well-formed XML:\n%s", out)
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			if se.Name.Local == "circle" {
				circles++
			}
		}
	}
	require.Equal(t, "svg", root)
	require.Equal(t, 7, circles, "one point per measured value")

	require.InDelta(t, 2.0, slope([]float64{1, 2, 3}, []float64{1, 3, 5}), 1e-9)
	require.True(t, math.IsNaN(slope([]float64{5}, []float64{1})))

	for _, bad := range []scaleSeries{
		{Name: "zero x", X: []float64{0, 10}, Y: []float64{1, 2}},
		{Name: "short", X: []float64{1, 10}, Y: []float64{1}},
		{Name: "negative", X: []float64{1}, Y: []float64{-1}},
		{Name: "nan", X: []float64{1}, Y: []float64{math.NaN()}},
	} {
		_, err := scaleChart{Series: []scaleSeries{bad}}.svg()
		require.ErrorIs(t, err, errChart, bad.Name)
	}
}
