module github.com/knitgo/knit

go 1.26
