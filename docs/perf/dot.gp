set terminal pngcairo size 1000,600
set output 'docs/perf/dot.png'
set title 'sdpa dot: throughput against size (higher is better)'
set logscale x 2
set format x '2^{%L}'
set xlabel 'n (floats)'
set ylabel 'GFLOP/s'
set key outside right
set grid
plot 'docs/perf/dot.dat' index 0 with linespoints title 'avx512', 'docs/perf/dot.dat' index 1 with linespoints title 'avx2', 'docs/perf/dot.dat' index 2 with linespoints title 'sse', 'docs/perf/dot.dat' index 3 with linespoints title 'scalar', 'docs/perf/dot.dat' index 4 with linespoints title 'openblas', 'docs/perf/dot.dat' index 5 with linespoints title 'naive'
