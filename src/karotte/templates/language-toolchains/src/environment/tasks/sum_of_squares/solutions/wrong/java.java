import java.util.Scanner;

public class Main {
    public static void main(String[] args) {
        long n = new Scanner(System.in).nextLong();
        long sum = 0;
        for (long k = 1; k <= n; k++) sum += k;
        System.out.println(sum);
    }
}
