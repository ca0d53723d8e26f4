#include <iostream>

int main() {
    long long n, sum = 0;
    if (!(std::cin >> n)) return 1;
    for (long long k = 1; k <= n; ++k) sum += k;
    std::cout << sum << '\n';
    return 0;
}
