package main

import "fmt"

func main() {
	var n int64
	if _, err := fmt.Scan(&n); err != nil {
		panic(err)
	}
	var sum int64
	for k := int64(1); k <= n; k++ {
		sum += k * k
	}
	fmt.Println(sum)
}
