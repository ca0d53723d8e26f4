#include <stdio.h>

int main(void) {
    long long n, sum = 0;
    if (scanf("%lld", &n) != 1) return 1;
    for (long long k = 1; k <= n; k++) sum += k;
    printf("%lld\n", sum);
    return 0;
}
