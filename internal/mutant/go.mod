module github.com/fencer-dev/fencer/internal/mutant

go 1.26.0
