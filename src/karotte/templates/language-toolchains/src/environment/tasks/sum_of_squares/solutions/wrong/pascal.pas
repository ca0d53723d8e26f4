program Squares;
var
  n, k, sum: Int64;
begin
  ReadLn(n);
  sum := 0;
  k := 1;
  while k <= n do
  begin
    sum := sum + k;
    k := k + 1;
  end;
  WriteLn(sum);
end.
