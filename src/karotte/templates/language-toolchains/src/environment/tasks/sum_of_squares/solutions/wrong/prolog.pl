:- initialization(main).

main :-
    read_integer(N),
    sum_squares(N, 0, S),
    write(S), nl,
    halt.

sum_squares(0, Acc, Acc) :- !.
sum_squares(K, Acc, S) :-
    Acc1 is Acc + K,
    K1 is K - 1,
    sum_squares(K1, Acc1, S).
