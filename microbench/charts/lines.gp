# One line per method over the receiver meshes of the 1-to-m suite (paper
# 002 Fig. 5 style). Variables: datafile, outfile, ncol, ylab, ttl.
set terminal pngcairo size 900,500 font ",11" noenhanced
set output outfile
set title ttl
set ylabel ylab
set xlabel "receiver mesh (hosts x devices per host); sender mesh (1,1)"
set key outside right top
set grid ytics
set yrange [0:*]
set datafile missing "NaN"
set datafile separator "\t"
plot for [i=2:ncol] datafile using 0:i:xtic(1) with linespoints lw 2 pt 7 title columnhead(i)
